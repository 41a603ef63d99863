//! Name resolution for allowed connections, in OpenShell's order: an IP literal is itself;
//! then every matching line of the sandbox's `/etc/hosts`; then the supervisor's own resolver
//! (getaddrinfo). The proxy calls [`Resolve::resolve`] exactly once per request and dials only
//! the addresses it returned and the address checks passed.
//!
//! The sandbox's hosts file is the sandbox's to write, and the supervisor reads it: it is
//! opened without following a final symlink, non-blocking (a FIFO planted there must not hang
//! the proxy), must be a regular file, and at most [`MAX_HOSTS_BYTES`] are read.
//!
//! What a read found is kept, by what identifies the file's content (device, inode, size,
//! mtime and ctime), so that a connection costs an `open` and an `fstat` of the file and a
//! scan of the kept text, not a read and a copy of it: the same file unchanged is not read
//! twice. The kernel stamps a
//! change with a coarse clock (a tick, or a second on some filesystems), so a rewrite of the
//! same size within one stamp of the read would keep the key: what was read is kept only
//! once the file's ctime is [`SETTLED`] old, as no later change can carry a stamp that old.
//! A kept answer is never trusted more than a fresh one: the sandbox writes this file
//! anyway, and the address checks run on whatever a resolution returns.
//!
//! A kept table also keeps its last [`MAX_ANSWERS`] answers, so that a name asked again costs
//! a comparison, not a scan of the file (tens of microseconds for a few hundred lines, on
//! every connection); an answer lives and dies with the text it was read from.

use std::future::Future;
use std::io::Read;
use std::net::IpAddr;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// The part of a hosts file that is read.
pub const MAX_HOSTS_BYTES: u64 = 1 << 20;

/// Why a name did not resolve.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("no address for {0}")]
    NoAddress(String),
    #[error("{0}")]
    Lookup(#[source] std::io::Error),
}

/// The boxed future of [`Resolve::resolve`].
pub type ResolveFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<IpAddr>, ResolveError>> + Send + 'a>>;

/// Turns a host into addresses. Called once per request.
pub trait Resolve: Send + Sync + 'static {
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> ResolveFuture<'a>;
}

/// The production resolver.
pub struct SandboxResolver {
    /// The sandbox's hosts file (e.g. `/proc/<pid>/root/etc/hosts`, or the file the view
    /// shows as `/etc/hosts`); `None` skips that step.
    hosts: Option<PathBuf>,
    /// Fall back to getaddrinfo in the supervisor's network namespace.
    system: bool,
    /// The hosts file last read, with the key of what was read.
    kept: Mutex<Option<(ContentKey, Arc<HostsTable>)>>,
}

impl SandboxResolver {
    /// Resolve through `hosts` (when given), then, with `system`, getaddrinfo.
    pub fn new(hosts: Option<PathBuf>, system: bool) -> Self {
        SandboxResolver {
            hosts,
            system,
            kept: Mutex::new(None),
        }
    }

    /// The hosts file at `path` as it is now: the kept text when the opened file's key is
    /// the kept key, else read (a large file on a blocking thread).
    async fn table(&self, path: &std::path::Path) -> std::io::Result<Arc<HostsTable>> {
        let (f, meta) = open_hosts(path)?;
        let key = ContentKey::of(&meta);
        if let Some((k, t)) = &*self.kept.lock().unwrap_or_else(|e| e.into_inner())
            && *k == key
        {
            return Ok(t.clone());
        }
        let len = meta.len();
        let table = if len <= INLINE_HOSTS_BYTES {
            HostsTable::new(read_open(f, len)?)
        } else {
            tokio::task::spawn_blocking(move || read_open(f, len).map(HostsTable::new))
                .await
                .map_err(std::io::Error::other)??
        };
        let table = Arc::new(table);
        if key.settled(SystemTime::now()) {
            *self.kept.lock().unwrap_or_else(|e| e.into_inner()) = Some((key, table.clone()));
        }
        Ok(table)
    }
}

/// How old a hosts file's last change must be before what was read of it is kept: longer
/// than the coarsest timestamp a Linux filesystem keeps (a second; two on FAT).
pub const SETTLED: Duration = Duration::from_secs(3);

/// What identifies a file's content without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ContentKey {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl ContentKey {
    fn of(m: &std::fs::Metadata) -> Self {
        ContentKey {
            dev: m.dev(),
            ino: m.ino(),
            size: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }

    /// Whether the last change is at least [`SETTLED`] before `now`: any later change then
    /// carries a different ctime.
    fn settled(&self, now: SystemTime) -> bool {
        let (Ok(now), Ok(s)) = (
            now.duration_since(SystemTime::UNIX_EPOCH),
            u64::try_from(self.ctime.0),
        ) else {
            return false;
        };
        let changed = Duration::new(s, self.ctime.1.clamp(0, 999_999_999) as u32);
        now.checked_sub(changed).is_some_and(|age| age >= SETTLED)
    }
}

/// A hosts file's text as read, and the answers last found in it. Kept as text, not as a map
/// of its names: what the supervisor holds for a sandbox stays the size of the file (at most
/// [`MAX_HOSTS_BYTES`]) plus [`MAX_ANSWERS`] short answers, where a map of a megabyte of
/// two-letter names would be tens.
#[derive(Debug, Default)]
struct HostsTable {
    text: String,
    /// Names (lower case, no trailing dot) with what [`HostsTable::scan`] found for them,
    /// oldest first.
    answers: Mutex<std::collections::VecDeque<Answer>>,
}

/// A name and the addresses the text gave it.
type Answer = (Box<str>, Arc<[IpAddr]>);

/// Answers a kept table holds at most.
pub const MAX_ANSWERS: usize = 64;
/// Addresses of one answer at most for it to be kept: a name the file lists thousands of
/// times is scanned for each time rather than held.
const MAX_KEPT_ADDRESSES: usize = 16;
/// The longest name kept (a DNS name's limit); a client's longer host is scanned for.
const MAX_KEPT_NAME: usize = 253;

impl HostsTable {
    fn new(text: String) -> Self {
        HostsTable {
            text,
            answers: Mutex::default(),
        }
    }

    /// Every address of every line that names `host` (case-insensitive, a trailing dot
    /// ignored), in file order, without repeats: the kept answer, else a scan of the text.
    fn lookup(&self, host: &str) -> Vec<IpAddr> {
        let want = host.trim_end_matches('.').to_ascii_lowercase();
        let answers = || self.answers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, ips)) = answers().iter().find(|(name, _)| **name == *want) {
            return ips.to_vec();
        }
        // Scanned unlocked: a megabyte's scan must not hold up other connections' names.
        let found = self.scan(&want);
        if found.len() <= MAX_KEPT_ADDRESSES && want.len() <= MAX_KEPT_NAME {
            let mut answers = answers();
            if !answers.iter().any(|(name, _)| **name == *want) {
                if answers.len() == MAX_ANSWERS {
                    answers.pop_front();
                }
                answers.push_back((want.into(), found.as_slice().into()));
            }
        }
        found
    }

    fn scan(&self, want: &str) -> Vec<IpAddr> {
        let mut out = Vec::new();
        for line in self.text.lines() {
            let line = line.split('#').next().unwrap_or("");
            let mut words = line.split_whitespace();
            let Some(ip) = words.next().and_then(|w| w.parse::<IpAddr>().ok()) else {
                continue;
            };
            if words.any(|n| n.trim_end_matches('.').eq_ignore_ascii_case(want))
                && !out.contains(&ip)
            {
                out.push(ip);
            }
        }
        out
    }
}

impl Resolve for SandboxResolver {
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> ResolveFuture<'a> {
        Box::pin(async move {
            if let Ok(ip) = host.parse::<IpAddr>() {
                return Ok(vec![ip]);
            }
            if let Some(path) = &self.hosts {
                // An unreadable hosts file is skipped, as a missing one is.
                if let Ok(table) = self.table(path).await {
                    let found = table.lookup(host);
                    if !found.is_empty() {
                        return Ok(found);
                    }
                }
            }
            if !self.system {
                return Err(ResolveError::NoAddress(host.to_string()));
            }
            let mut out: Vec<IpAddr> = Vec::new();
            for a in tokio::net::lookup_host((host, port))
                .await
                .map_err(ResolveError::Lookup)?
            {
                if !out.contains(&a.ip()) {
                    out.push(a.ip());
                }
            }
            if out.is_empty() {
                return Err(ResolveError::NoAddress(host.to_string()));
            }
            Ok(out)
        })
    }
}

/// Hosts files up to this size are read on the async worker, where a read of a few KiB
/// costs microseconds and the hop to a blocking thread and back costs tens (BENCHMARKS.md,
/// the egress proxy); a larger one (the sandbox's to grow, up to [`MAX_HOSTS_BYTES`]) is read
/// on a blocking thread.
const INLINE_HOSTS_BYTES: u64 = 64 << 10;

/// Read a hosts file the sandbox may control (see the module doc).
pub fn read_hosts(path: &std::path::Path) -> std::io::Result<String> {
    let (f, meta) = open_hosts(path)?;
    read_open(f, meta.len())
}

/// Open a hosts file the sandbox may control: no final symlink followed, non-blocking (a
/// FIFO planted there must not hang the proxy), a regular file; with its metadata.
fn open_hosts(path: &std::path::Path) -> std::io::Result<(std::fs::File, std::fs::Metadata)> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let m = f.metadata()?;
    if !m.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok((f, m))
}

/// At most [`MAX_HOSTS_BYTES`] of an opened hosts file whose size was `len` when opened. The
/// buffer has room for that size and one byte more, so a file that has not changed is read
/// in one read(2) and the one that returns 0 (from an empty buffer `read_to_end` starts at 32
/// bytes and doubles: a dozen reads per connection for a few KiB). A file that grew since is
/// still read to its end or the limit.
fn read_open(f: std::fs::File, len: u64) -> std::io::Result<String> {
    let mut buf = Vec::with_capacity(len.min(MAX_HOSTS_BYTES) as usize + 1);
    f.take(MAX_HOSTS_BYTES).read_to_end(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts_lookup(text: &str, host: &str) -> Vec<IpAddr> {
        HostsTable::new(text.to_string()).lookup(host)
    }

    #[test]
    fn hosts_lines() {
        let t = "# c\n192.88.99.10  pub.test a.wild.test\n10.77.0.10 db.corp.test mixed.wild.test\n192.88.99.10 mixed.wild.test # again\n  \nbad line\n::1 localhost ip6-localhost\n";
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(hosts_lookup(t, "PUB.test"), [ip("192.88.99.10")]);
        assert_eq!(
            hosts_lookup(t, "mixed.wild.test"),
            [ip("10.77.0.10"), ip("192.88.99.10")]
        );
        assert_eq!(hosts_lookup(t, "localhost"), [ip("::1")]);
        assert!(hosts_lookup(t, "nx.wild.test").is_empty());
        assert!(hosts_lookup(t, "line").is_empty());
        assert_eq!(hosts_lookup(t, "pub.test."), [ip("192.88.99.10")]);
    }

    /// A small file is read on the worker, a large one on a blocking thread: both find the
    /// name, the large one at its end.
    #[tokio::test]
    async fn small_and_large_hosts_files_resolve() {
        let d = tempfile::tempdir().unwrap();
        let small = d.path().join("small");
        std::fs::write(&small, "192.88.99.10 up.test\n").unwrap();
        let large = d.path().join("large");
        let mut t = "# filler\n".repeat((INLINE_HOSTS_BYTES as usize) / 9 + 1);
        t.push_str("192.88.99.11 up.test\n");
        assert!(t.len() as u64 > INLINE_HOSTS_BYTES);
        std::fs::write(&large, t).unwrap();
        for (path, want) in [(small, "192.88.99.10"), (large, "192.88.99.11")] {
            let r = SandboxResolver::new(Some(path), false);
            let got = r.resolve("up.test", 80).await.unwrap();
            assert_eq!(got, [want.parse::<IpAddr>().unwrap()]);
            assert!(matches!(
                r.resolve("nx.test", 80).await,
                Err(ResolveError::NoAddress(_))
            ));
        }
    }

    #[test]
    fn a_fifo_or_a_link_is_not_read() {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo on a path we own.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(read_hosts(&fifo).is_err());
        let real = d.path().join("real");
        std::fs::write(&real, "1.2.3.4 x\n").unwrap();
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(read_hosts(&link).is_err());
        assert_eq!(read_hosts(&real).unwrap(), "1.2.3.4 x\n");
    }

    /// A hosts file that grows or shrinks between the open and the read is read as it is
    /// then, to its end or the limit: the size at the open only sizes the buffer.
    #[test]
    fn a_file_that_changed_after_the_open_is_read_as_it_is() {
        use std::io::Write;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("hosts");
        std::fs::write(&p, "1.2.3.4 a\n").unwrap();
        let (f, m) = open_hosts(&p).unwrap();
        let mut w = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        w.write_all(&b"5.6.7.8 b\n".repeat(1000)).unwrap();
        let t = read_open(f, m.len()).unwrap();
        assert_eq!(t.len(), 10 + 10 * 1000);
        assert_eq!(
            hosts_lookup(&t, "b"),
            ["5.6.7.8".parse::<IpAddr>().unwrap()]
        );
        let (f, m) = open_hosts(&p).unwrap();
        std::fs::write(&p, "9.9.9.9 c\n").unwrap();
        assert_eq!(read_open(f, m.len()).unwrap(), "9.9.9.9 c\n");
        let big = d.path().join("big");
        std::fs::write(&big, vec![b'#'; MAX_HOSTS_BYTES as usize + 10]).unwrap();
        let (f, m) = open_hosts(&big).unwrap();
        assert_eq!(
            read_open(f, m.len()).unwrap().len(),
            MAX_HOSTS_BYTES as usize
        );
    }

    /// A file read once and unchanged is answered from what was kept (its content is not
    /// read again: a name added behind the key's back is not seen), while any change the
    /// kernel stamps (a rewrite of the same size, a new inode, a touch) is read anew.
    #[tokio::test]
    async fn a_settled_file_is_read_once_and_read_again_when_it_changes() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("hosts");
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        std::fs::write(&p, "192.88.99.10 up.test\n").unwrap();
        let r = SandboxResolver::new(Some(p.clone()), false);
        // Fresh: read each time, never kept.
        assert_eq!(
            r.resolve("up.test", 80).await.unwrap(),
            [ip("192.88.99.10")]
        );
        assert!(
            r.kept.lock().unwrap().is_none(),
            "a file changed just now is not kept"
        );
        // Kept under the file's current key (as a read SETTLED after its change keeps it;
        // the clock is tested on its own below): the kept table answers, the file is not read.
        let (_, m) = open_hosts(&p).unwrap();
        let key = ContentKey::of(&m);
        let planted = Arc::new(HostsTable::new("192.88.99.77 up.test\n".into()));
        *r.kept.lock().unwrap() = Some((key, planted));
        assert_eq!(
            r.resolve("up.test", 80).await.unwrap(),
            [ip("192.88.99.77")]
        );
        // Any change the kernel records gives a new key: read anew.
        std::fs::write(&p, "192.88.99.11 up.test\n").unwrap();
        assert_eq!(
            r.resolve("up.test", 80).await.unwrap(),
            [ip("192.88.99.11")]
        );
        let other = d.path().join("other");
        std::fs::write(&other, "192.88.99.12 up.test\n").unwrap();
        std::fs::rename(&other, &p).unwrap();
        assert_eq!(
            r.resolve("up.test", 80).await.unwrap(),
            [ip("192.88.99.12")]
        );
    }

    /// A name asked again is answered from the table's kept answers (planted here: the text
    /// is not scanned again), however the name is spelled; the answers are bounded, the
    /// oldest going first, and a name with too many addresses or too long is not kept.
    #[test]
    fn a_table_keeps_its_last_answers_and_no_more() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let t = HostsTable::new("192.88.99.10 up.test\n".into());
        assert_eq!(t.lookup("UP.test."), [ip("192.88.99.10")]);
        assert!(t.lookup("nx.test").is_empty());
        let kept = |t: &HostsTable| -> Vec<String> {
            t.answers
                .lock()
                .unwrap()
                .iter()
                .map(|(n, _)| n.to_string())
                .collect()
        };
        assert_eq!(kept(&t), ["up.test", "nx.test"]);
        // What is kept is what answers (the text is not read again).
        t.answers.lock().unwrap()[0].1 = Arc::from([ip("192.88.99.77")]);
        assert_eq!(t.lookup("up.test"), [ip("192.88.99.77")]);
        assert_eq!(kept(&t).len(), 2, "asked again, not kept twice");
        for i in 0..MAX_ANSWERS {
            t.lookup(&format!("n{i}.test"));
        }
        let names = kept(&t);
        assert_eq!(names.len(), MAX_ANSWERS);
        assert!(
            !names.contains(&"up.test".to_string()),
            "the oldest went first"
        );
        assert_eq!(t.lookup("up.test"), [ip("192.88.99.10")], "scanned again");
        // Too many addresses, or too long a name: answered, not kept.
        let many: String = (0..=MAX_KEPT_ADDRESSES)
            .map(|i| format!("10.0.0.{i} many.test\n"))
            .collect();
        let t = HostsTable::new(many);
        assert_eq!(t.lookup("many.test").len(), MAX_KEPT_ADDRESSES + 1);
        let long = "a".repeat(MAX_KEPT_NAME + 1);
        assert!(t.lookup(&long).is_empty());
        assert!(kept(&t).is_empty());
    }

    #[test]
    fn only_a_change_older_than_settled_is_kept() {
        let key = |ctime: SystemTime| {
            let d = ctime.duration_since(SystemTime::UNIX_EPOCH).unwrap();
            ContentKey {
                dev: 1,
                ino: 2,
                size: 3,
                mtime: (0, 0),
                ctime: (d.as_secs() as i64, i64::from(d.subsec_nanos())),
            }
        };
        let now = SystemTime::now();
        assert!(key(now - SETTLED).settled(now));
        assert!(key(now - SETTLED * 10).settled(now));
        assert!(!key(now - SETTLED + Duration::from_millis(1)).settled(now));
        assert!(!key(now).settled(now));
        // A ctime in the future (a clock set back) is never settled.
        assert!(!key(now + Duration::from_secs(60)).settled(now));
    }
}
