//! /proc/PID/maps, parsed once for every census that looks at a process's mappings.

/// One line of /proc/PID/maps.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mapping<'a> {
    pub lo: u64,
    pub hi: u64,
    /// "rw-p", "r-xp", "---p", ...
    pub perms: &'a str,
    pub offset: u64,
    pub inode: &'a str,
    /// The file, or a name such as "[heap]"; empty for an anonymous mapping.
    pub path: &'a str,
}

impl Mapping<'_> {
    /// Anonymous and unnamed: no file, no "[heap]" or "[stack]".
    pub fn anonymous(&self) -> bool {
        self.inode == "0" && self.path.is_empty()
    }
}

/// The mappings of a /proc/PID/maps text, in its order; lines that do not parse are left
/// out.
pub(crate) fn parse(text: &str) -> impl Iterator<Item = Mapping<'_>> {
    text.lines().filter_map(|line| {
        let mut f = line.split_whitespace();
        let (lo, hi) = f.next()?.split_once('-')?;
        let perms = f.next()?;
        let offset = u64::from_str_radix(f.next()?, 16).ok()?;
        let _device = f.next()?;
        let inode = f.next()?;
        Some(Mapping {
            lo: u64::from_str_radix(lo, 16).ok()?,
            hi: u64::from_str_radix(hi, 16).ok()?,
            perms,
            offset,
            inode,
            path: f.next().unwrap_or(""),
        })
    })
}

/// The text of /proc/PID/maps.
pub(crate) fn read(pid: u32) -> std::io::Result<String> {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
}
