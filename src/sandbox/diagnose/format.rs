//! The two formats whose interpreter the examination reads: a `#!` line and an ELF program
//! header table. Pure functions on bytes already read, so that the child only reads and these
//! only look.

const PT_INTERP: u32 = 3;

/// The interpreter of a `#!` line in the first bytes of a file, as the kernel takes it: after
/// `#!` and blanks, up to the next blank or the end of the line.
pub(crate) fn shebang(head: &[u8]) -> Option<&[u8]> {
    let line = head.strip_prefix(b"#!")?;
    let line = &line[..line.iter().position(|&c| c == b'\n').unwrap_or(line.len())];
    let start = line.iter().position(|&c| c != b' ' && c != b'\t')?;
    let line = &line[start..];
    let end = line
        .iter()
        .position(|&c| c == b' ' || c == b'\t' || c == 0)
        .unwrap_or(line.len());
    (end > 0).then(|| &line[..end])
}

/// The program header table of an ELF file, from its first bytes.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Elf {
    is64: bool,
    le: bool,
    pub(super) phoff: u64,
    pub(super) phentsize: usize,
    pub(super) phnum: usize,
}

impl Elf {
    pub(crate) fn parse(h: &[u8]) -> Option<Elf> {
        if h.len() < 52 || &h[..4] != b"\x7fELF" {
            return None;
        }
        let is64 = match h[4] {
            1 => false,
            2 => true,
            _ => return None,
        };
        let le = match h[5] {
            1 => true,
            2 => false,
            _ => return None,
        };
        let e = Endian(le);
        let (phoff, phentsize, phnum) = if is64 {
            if h.len() < 64 {
                return None;
            }
            (e.u64(&h[32..]), e.u16(&h[54..]), e.u16(&h[56..]))
        } else {
            (u64::from(e.u32(&h[28..])), e.u16(&h[42..]), e.u16(&h[44..]))
        };
        let min = if is64 { 56 } else { 32 };
        (usize::from(phentsize) >= min).then_some(Elf {
            is64,
            le,
            phoff,
            phentsize: usize::from(phentsize),
            phnum: usize::from(phnum),
        })
    }

    /// (offset, size) of the PT_INTERP string, from the program headers.
    pub(crate) fn interp(&self, phdrs: &[u8]) -> Option<(u64, u64)> {
        let e = Endian(self.le);
        phdrs
            .chunks_exact(self.phentsize)
            .take(self.phnum)
            .find(|ph| e.u32(ph) == PT_INTERP)
            .map(|ph| {
                if self.is64 {
                    (e.u64(&ph[8..]), e.u64(&ph[32..]))
                } else {
                    (u64::from(e.u32(&ph[4..])), u64::from(e.u32(&ph[16..])))
                }
            })
    }
}

struct Endian(bool);

impl Endian {
    fn u16(&self, b: &[u8]) -> u16 {
        let a = [b[0], b[1]];
        if self.0 {
            u16::from_le_bytes(a)
        } else {
            u16::from_be_bytes(a)
        }
    }
    fn u32(&self, b: &[u8]) -> u32 {
        let a = [b[0], b[1], b[2], b[3]];
        if self.0 {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        }
    }
    fn u64(&self, b: &[u8]) -> u64 {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[..8]);
        if self.0 {
            u64::from_le_bytes(a)
        } else {
            u64::from_be_bytes(a)
        }
    }
}
