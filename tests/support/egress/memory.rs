//! Looking for a value in the memory of running processes, from outside (as root).

/// Every descendant of `pid` (the children files of each of its threads).
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        let Ok(dir) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for t in dir.flatten() {
            let f = t.path().join("children");
            for c in std::fs::read_to_string(f)
                .unwrap_or_default()
                .split_whitespace()
            {
                let c: u32 = c.parse().unwrap();
                out.push(c);
                todo.push(c);
            }
        }
    }
    out
}

/// How many readable mappings of `pid` hold `needle`, and which.
pub fn memory_holding(pid: u32, needle: &[u8]) -> Vec<String> {
    use std::io::{Read, Seek, SeekFrom};
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let Ok(mut mem) = std::fs::File::open(format!("/proc/{pid}/mem")) else {
        return Vec::new();
    };
    let mut hits = Vec::new();
    for line in maps.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(range), Some(perms)) = (f.first(), f.get(1)) else {
            continue;
        };
        // Only what the process wrote or was given: not the images of its files.
        if !perms.starts_with("rw") || line.contains("[vvar") {
            continue;
        }
        let (a, b) = range.split_once('-').unwrap();
        let (a, b) = (
            u64::from_str_radix(a, 16).unwrap(),
            u64::from_str_radix(b, 16).unwrap(),
        );
        let mut buf = vec![0u8; (b - a) as usize];
        if mem.seek(SeekFrom::Start(a)).is_err() || mem.read_exact(&mut buf).is_err() {
            continue;
        }
        if buf.windows(needle.len()).any(|w| w == needle) {
            hits.push(line.to_string());
        }
    }
    hits
}

/// [`memory_holding`] for every process below `pid`: (pid, uid, the mappings holding
/// `needle`), for each one.
pub fn below_holding(pid: u32, needle: &[u8]) -> Vec<(u32, String, Vec<String>)> {
    descendants(pid)
        .into_iter()
        .map(|p| {
            let status = std::fs::read_to_string(format!("/proc/{p}/status")).unwrap_or_default();
            let uid = status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().next())
                .unwrap_or("?")
                .to_string();
            (p, uid, memory_holding(p, needle))
        })
        .collect()
}
