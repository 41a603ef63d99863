use super::*;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;

#[test]
fn a_shebang_names_its_first_word_as_the_kernel_does() {
    assert_eq!(shebang(b"#!/bin/sh\necho"), Some(&b"/bin/sh"[..]));
    assert_eq!(
        shebang(b"#! \t/usr/bin/env python3 -u\n"),
        Some(&b"/usr/bin/env"[..])
    );
    assert_eq!(shebang(b"#!/bin/sh"), Some(&b"/bin/sh"[..]));
    assert_eq!(shebang(b"#!\n/bin/sh"), None);
    assert_eq!(shebang(b"#!   \n"), None);
    assert_eq!(shebang(b"\x7fELF"), None);
}

fn elf_header(is64: bool, le: bool, phoff: u64, phnum: u16) -> Vec<u8> {
    let mut h = vec![0u8; 64];
    h[..4].copy_from_slice(b"\x7fELF");
    h[4] = if is64 { 2 } else { 1 };
    h[5] = if le { 1 } else { 2 };
    let put16 = |h: &mut Vec<u8>, o: usize, v: u16| {
        let b = if le { v.to_le_bytes() } else { v.to_be_bytes() };
        h[o..o + 2].copy_from_slice(&b);
    };
    if is64 {
        let b = if le {
            phoff.to_le_bytes()
        } else {
            phoff.to_be_bytes()
        };
        h[32..40].copy_from_slice(&b);
        put16(&mut h, 54, 56);
        put16(&mut h, 56, phnum);
    } else {
        let b = if le {
            (phoff as u32).to_le_bytes()
        } else {
            (phoff as u32).to_be_bytes()
        };
        h[28..32].copy_from_slice(&b);
        put16(&mut h, 42, 32);
        put16(&mut h, 44, phnum);
    }
    h
}

#[test]
fn elf_headers_of_both_classes_and_byte_orders_give_their_interp() {
    for (is64, le) in [(true, true), (true, false), (false, true), (false, false)] {
        let elf = Elf::parse(&elf_header(is64, le, 64, 2)).unwrap();
        let size = if is64 { 56 } else { 32 };
        let mut phdrs = vec![0u8; size * 2];
        let (ty, off, filesz) = if is64 { (0, 8, 32) } else { (0, 4, 16) };
        let e = |v: u64, n: usize| -> Vec<u8> {
            let b = if le { v.to_le_bytes() } else { v.to_be_bytes() };
            if le {
                b[..n].to_vec()
            } else {
                b[8 - n..].to_vec()
            }
        };
        let w = if is64 { 8 } else { 4 };
        phdrs[size + ty..size + ty + 4].copy_from_slice(&e(3, 4));
        phdrs[size + off..size + off + w].copy_from_slice(&e(0x318, w));
        phdrs[size + filesz..size + filesz + w].copy_from_slice(&e(28, w));
        assert_eq!(elf.interp(&phdrs), Some((0x318, 28)), "{is64} {le}");
        assert_eq!(elf.interp(&phdrs[..size]), None);
    }
    assert_eq!(Elf::parse(b"#!/bin/sh\n"), None);
    assert_eq!(Elf::parse(&elf_header(true, true, 64, 1)[..40]), None);
}

/// A tree standing for the view's root, and its descriptor.
struct Root {
    dir: tempfile::TempDir,
    fd: std::fs::File,
}

impl Root {
    fn new() -> Root {
        let dir = tempfile::tempdir().unwrap();
        let fd = std::fs::File::open(dir.path()).unwrap();
        Root { dir, fd }
    }
    fn p(&self, rel: &str) -> std::path::PathBuf {
        self.dir.path().join(rel.trim_start_matches('/'))
    }
    fn file(&self, rel: &str, text: &[u8]) {
        let p = self.p(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    fn link(&self, rel: &str, target: &str) {
        let p = self.p(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        symlink(target, p).unwrap();
    }
    fn examine(&self, path: &str) -> Diagnosis {
        let cwd = std::fs::File::open(self.p("/work")).unwrap();
        let mut rec = Record::new(Finding::NotFound, 0);
        examine(
            self.fd.as_raw_fd(),
            (cwd.as_raw_fd(), b"/work"),
            path.as_bytes(),
            &mut rec,
        );
        Diagnosis::decode(rec.bytes()).unwrap()
    }
}

#[test]
fn a_missing_interpreter_is_named_with_the_component_the_links_led_to() {
    let r = Root::new();
    std::fs::create_dir_all(r.p("/work")).unwrap();
    // As on Debian: the loader's name goes through /lib64 -> usr/lib64, then an absolute link
    // into /lib, which this root lacks.
    r.file("/usr/bin/prog", b"#!/lib64/ld.so -x\n");
    r.link("/lib64", "usr/lib64");
    r.link("/usr/lib64/ld.so", "/lib/x/ld.so");
    let d = r.examine("/usr/bin/prog");
    assert_eq!(d.finding, Finding::InterpreterMissing, "{d:?}");
    assert_eq!(d.interp, Some(Interp::Script));
    assert_eq!(d.subject, Path::new("/lib64/ld.so"));
    assert_eq!(d.holder.as_deref(), Some(Path::new("/usr/bin/prog")));
    assert_eq!(d.at, Path::new("/lib"));
    assert_eq!(d.full, Path::new("/lib/x/ld.so"));

    // With /lib, the loader is there (a file of no known format names nothing more).
    r.link("/lib", "usr/lib");
    r.file("/usr/lib/x/ld.so", b"loader");
    let d = r.examine("/usr/bin/prog");
    assert_eq!(d.finding, Finding::Startable, "{d:?}");
    // `..`, `.` and doubled slashes walk as the kernel's lookup does; `..` stays at the root.
    let d = r.examine("/../usr/./bin//../bin/prog");
    assert_eq!(d.finding, Finding::Startable, "{d:?}");
    // A relative path starts at the working directory.
    r.file("/work/run.sh", b"#!../usr/bin/prog\n");
    let d = r.examine("run.sh");
    assert_eq!(d.finding, Finding::Startable, "{d:?}");
    let d = r.examine("./missing.sh");
    assert_eq!(d.finding, Finding::NotFound, "{d:?}");
    assert_eq!(d.at, Path::new("/work/missing.sh"));
}

#[test]
fn a_fifo_a_device_link_and_a_directory_are_not_regular_and_never_opened() {
    let r = Root::new();
    std::fs::create_dir_all(r.p("/work/dir")).unwrap();
    let fifo = std::ffi::CString::new(r.p("/work/fifo").to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    let rc = unsafe { libc::mkfifo(fifo.as_ptr(), 0o755) };
    assert_eq!(rc, 0);
    // The host's /dev/tty is outside this root: the link resolves inside it, to nothing.
    r.link("/work/tty", "/dev/tty");
    std::fs::create_dir_all(r.p("/dev")).unwrap();
    // If the walk opened the FIFO for reading, this test would hang here.
    let d = r.examine("/work/fifo");
    assert_eq!(d.finding, Finding::NotRegular, "{d:?}");
    assert_eq!(d.mode & libc::S_IFMT, libc::S_IFIFO);
    let d = r.examine("dir");
    assert_eq!(d.finding, Finding::NotRegular, "{d:?}");
    assert_eq!(d.mode & libc::S_IFMT, libc::S_IFDIR);
    let d = r.examine("tty");
    assert_eq!(d.finding, Finding::NotFound, "{d:?}");
    assert_eq!(d.at, Path::new("/dev/tty"));
}

#[test]
fn a_link_loop_ends_the_walk() {
    let r = Root::new();
    std::fs::create_dir_all(r.p("/work")).unwrap();
    r.link("/work/a", "b");
    r.link("/work/b", "a");
    let d = r.examine("a");
    assert_eq!((d.finding, d.errno), (Finding::Unexplained, libc::ELOOP));
}

#[test]
fn a_record_keeps_every_field_and_marks_a_cut_path() {
    let mut rec = Record::new(Finding::NoSearch, 3);
    rec.interp(Some(Interp::Elf));
    rec.numbers(libc::EACCES, 0o40700, 0);
    let long = vec![b'x'; SHOWN + 5];
    rec.paths([b"/a", b"/b", &long, b"/d"]);
    assert!(rec.bytes().len() <= RECORD_MAX);
    let d = Diagnosis::decode(rec.bytes()).unwrap();
    assert_eq!(d.finding, Finding::NoSearch);
    assert_eq!(d.candidate, Some(3));
    assert_eq!(d.interp, Some(Interp::Elf));
    assert_eq!((d.errno, d.mode, d.owner), (libc::EACCES, 0o40700, 0));
    assert_eq!(d.subject, Path::new("/a"));
    assert_eq!(d.holder.as_deref(), Some(Path::new("/b")));
    assert_eq!(d.at.as_os_str().len(), SHOWN);
    assert!(d.truncated);
    // The largest record still fits one atomic pipe write.
    let mut rec = Record::new(Finding::InterpreterMissing, NONE);
    rec.paths([&long, &long, &long, &long]);
    assert!(rec.bytes().len() <= RECORD_MAX);
    assert_eq!(Diagnosis::decode(rec.bytes()).unwrap().candidate, None);
    assert_eq!(Diagnosis::decode(&rec.bytes()[..30]), None);
    // A terminal escape on a `#!` line is not passed on.
    let mut rec = Record::new(Finding::InterpreterMissing, 0);
    rec.paths([b"/x\x1b]0;owned\x07", b"", b"/", b"/"]);
    let d = Diagnosis::decode(rec.bytes()).unwrap();
    assert_eq!(d.subject, Path::new("/x?]0;owned?"));
}

#[test]
fn proc_fd_paths_are_written_without_allocating() {
    let mut b = [0u8; 32];
    proc_fd_path(&mut b, 1234);
    assert_eq!(&b[..19], b"/proc/self/fd/1234\0");
    proc_fd_path(&mut b, 0);
    assert_eq!(&b[..16], b"/proc/self/fd/0\0");
}

/// A real dynamically linked program in a root without its loader: its PT_INTERP is named.
#[test]
fn a_real_elf_programs_loader_is_read_from_its_headers() {
    let host = std::fs::read("/bin/true").unwrap();
    let Some(elf) = Elf::parse(&host) else {
        eprintln!("SKIPPED: /bin/true is not ELF");
        return;
    };
    let phdrs = &host[elf.phoff as usize..];
    let Some((off, size)) = elf.interp(phdrs) else {
        eprintln!("SKIPPED: /bin/true is static");
        return;
    };
    let want = &host[off as usize..(off + size) as usize];
    let want = std::str::from_utf8(&want[..want.len() - 1]).unwrap();
    let r = Root::new();
    std::fs::create_dir_all(r.p("/work")).unwrap();
    r.file("/usr/bin/true", &host);
    let d = r.examine("/usr/bin/true");
    assert_eq!(d.finding, Finding::InterpreterMissing, "{d:?}");
    assert_eq!(d.interp, Some(Interp::Elf));
    assert_eq!(d.subject, Path::new(want));
}
