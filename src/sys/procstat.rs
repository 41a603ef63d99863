//! Fields of a `/proc/PID/stat` line, numbered as proc(5) numbers them.
//!
//! Field 2, the command name, is in parentheses and may itself hold spaces and parentheses
//! (a process names itself with `prctl(PR_SET_NAME)`, or by the file it runs): so the fields
//! after it are counted from the line's **last** `)`, never by splitting the whole line. A
//! sandboxed process that names itself `x) R 1 2` must not shift what the supervisor reads.

use std::str::FromStr;

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
}
