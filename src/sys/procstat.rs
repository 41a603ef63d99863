//! Fields of a `/proc/PID/stat` line, numbered as proc(5) numbers them.
//!
//! Field 2, the command name, is in parentheses and may itself hold spaces and parentheses
//! (a process names itself with `prctl(PR_SET_NAME)`, or by the file it runs): so the fields
//! after it are counted from the line's **last** `)`, never by splitting the whole line. A
//! sandboxed process that names itself `x) R 1 2` must not shift what the supervisor reads.
//!
//! [`read_record`] reads such a file (and the other one-record files, `status`, `cgroup`) in
//! one `read`, where `fs::read_to_string` asks for a size a `/proc` file does not have and
//! reads up from 32 bytes: eight system calls for a stat line.

use std::io::Read;
use std::str::FromStr;

/// Room for the whole of a one-record `/proc` file in one read.
pub const FIRST_READ: usize = 4096;

/// The whole of a `/proc` file that the kernel makes as one record, in one `show` of a
/// `single_open` seq file (`stat`, `status`, `cgroup`): the first read returns all of it when
/// the buffer is larger, so a read that leaves room is the end, and the read that would
/// return 0 is not made. One larger than the buffer is read on to its end.
pub fn read_record(path: &str) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; FIRST_READ];
    let n = loop {
        match f.read(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            r => break r?,
        }
    };
    buf.truncate(n);
    if n == FIRST_READ {
        f.take(16 << 20).read_to_end(&mut buf)?;
    }
    String::from_utf8(buf).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// The fields of one stat line from field 3 (the state) on.
#[derive(Clone, Copy, Debug)]
pub struct StatLine<'a> {
    rest: &'a str,
}

impl<'a> StatLine<'a> {
    /// `None` when the line has no `)` (not a stat line).
    pub fn new(line: &'a str) -> Option<StatLine<'a>> {
        let i = line.rfind(')')?;
        Some(StatLine {
            rest: &line[i + 1..],
        })
    }

    /// Field `n` as proc(5) numbers it (3 is the state, 4 the ppid, 28 `startstack`, …);
    /// `None` for fields 1 and 2 (before the fields counted here) and past the line's end.
    pub fn field(&self, n: usize) -> Option<&'a str> {
        self.rest.split_whitespace().nth(n.checked_sub(3)?)
    }

    /// Field `n` parsed as a number; `None` when absent or not one.
    pub fn num<T: FromStr>(&self, n: usize) -> Option<T> {
        self.field(n)?.parse().ok()
    }

    /// Fields `first..first + N` parsed as numbers, in one pass over the line.
    pub fn nums<T: FromStr + Copy + Default, const N: usize>(
        &self,
        first: usize,
    ) -> Option<[T; N]> {
        let mut out = [T::default(); N];
        let mut it = self.rest.split_whitespace().skip(first.checked_sub(3)?);
        for slot in &mut out {
            *slot = it.next()?.parse().ok()?;
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line whose command name holds `) ` and digits, as a process can name itself.
    fn hostile() -> String {
        let rest: Vec<String> = (3..=52).map(|f| f.to_string()).collect();
        format!("4242 (a) 9 9 (c)) {}", rest.join(" "))
    }

    #[test]
    fn fields_count_from_the_last_parenthesis() {
        let line = hostile();
        let s = StatLine::new(&line).unwrap();
        assert_eq!(s.field(3), Some("3"));
        assert_eq!(s.num::<u64>(28), Some(28));
        assert_eq!(s.num::<u64>(52), Some(52));
        assert_eq!(s.field(53), None);
        assert_eq!(s.nums::<usize, 4>(48), Some([48, 49, 50, 51]));
        assert_eq!(s.nums::<usize, 4>(50), None, "runs past the end");
    }

    #[test]
    fn the_command_name_and_bad_lines_give_nothing() {
        let line = hostile();
        let s = StatLine::new(&line).unwrap();
        assert_eq!(s.field(1), None);
        assert_eq!(s.field(2), None);
        assert!(StatLine::new("no parenthesis").is_none());
        let short = StatLine::new("7 (x) S 1 x").unwrap();
        assert_eq!(short.num::<i32>(4), Some(1));
        assert_eq!(short.num::<i32>(5), None, "not a number");
    }

    /// A one-record file reads as `read_to_string` reads it, however long it is. `stat` and
    /// `status` count faults and switches, which move between two reads of the same process:
    /// their shape is compared (the fields, the keys), `cgroup` whole.
    #[test]
    fn a_record_is_read_whole() {
        let both = |p: &str| (read_record(p).unwrap(), std::fs::read_to_string(p).unwrap());
        let (a, b) = both("/proc/self/stat");
        let fields = |s: &str| s.split_whitespace().count();
        assert!(a.ends_with('\n'), "{a}");
        assert_eq!(fields(&a), fields(&b), "{a}\n{b}");
        let (a, b) = both("/proc/self/status");
        let keys = |s: &str| -> Vec<String> {
            s.lines()
                .map(|l| l.split(':').next().unwrap_or("").to_string())
                .collect()
        };
        assert!(a.ends_with('\n'), "{a}");
        assert_eq!(keys(&a), keys(&b));
        let (a, b) = both("/proc/self/cgroup");
        assert_eq!(a, b);
        let d = tempfile::tempdir().unwrap();
        for len in [
            0,
            1,
            FIRST_READ - 1,
            FIRST_READ,
            FIRST_READ + 1,
            3 * FIRST_READ,
        ] {
            let p = d.path().join(format!("f{len}"));
            let text = "x".repeat(len);
            std::fs::write(&p, &text).unwrap();
            assert_eq!(
                read_record(p.to_str().unwrap()).unwrap(),
                text,
                "{len} bytes"
            );
        }
        assert!(read_record("/proc/self/no-such-file").is_err());
    }
}
