//! Reading a traced process's /proc files: status (RSS), smaps_rollup, maps and pagemap.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;

use fragscope_trace::{Mapping, ResidentRange, RssSample};

/// VmRSS and its parts from /proc/PID/status; `None` once the process is gone (or a zombie).
pub fn read_rss(pid: u32, tick: u64) -> Option<RssSample> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_status(&text, tick)
}

pub fn parse_status(text: &str, tick: u64) -> Option<RssSample> {
    let mut s = RssSample {
        tick,
        ..Default::default()
    };
    let mut seen_rss = false;
    for line in text.lines() {
        let Some((key, rest)) = line.split_once(':') else {
            continue;
        };
        let kib = || {
            rest.split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        match key {
            "VmRSS" => {
                s.vm_rss_kib = kib();
                seen_rss = true;
            }
            "RssAnon" => s.rss_anon_kib = kib(),
            "RssFile" => s.rss_file_kib = kib(),
            "RssShmem" => s.rss_shmem_kib = kib(),
            _ => {}
        }
    }
    seen_rss.then_some(s)
}

/// The value of `field` in /proc/`who`/status (`who`: a pid, a tid or "self"), trimmed.
pub fn status_field(who: impl std::fmt::Display, field: &str) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{who}/status")).ok()?;
    text.lines().find_map(|l| {
        let (key, value) = l.split_once(':')?;
        (key == field).then(|| value.trim().to_string())
    })
}

/// What tells one program image of a process from the next it execs: its executable,
/// and where its code and its stack start (placed anew at every exec). Fields that
/// cannot be read are `None`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageMark {
    exe: Option<std::path::PathBuf>,
    code_and_stack: Option<(u64, u64)>,
}

impl ImageMark {
    /// Whether `now` may be the same image: no field read both times differs (a process
    /// that dropped its privileges hides them from another user).
    pub fn may_be(&self, now: &ImageMark) -> bool {
        fn agree<T: PartialEq>(a: &Option<T>, b: &Option<T>) -> bool {
            a.is_none() || b.is_none() || a == b
        }
        agree(&self.exe, &now.exe) && agree(&self.code_and_stack, &now.code_and_stack)
    }
}

/// The image process `pid` runs now.
pub fn image_mark(pid: u32) -> ImageMark {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
    ImageMark {
        exe: std::fs::read_link(format!("/proc/{pid}/exe")).ok(),
        code_and_stack: stat.as_deref().and_then(code_and_stack_starts),
    }
}

/// Field `n` (numbered from 1, as proc(5) numbers them) of a /proc/PID/stat line, read
/// past the command name (field 2), which may itself hold spaces and parentheses.
fn stat_field<T: std::str::FromStr>(stat: &str, n: usize) -> Option<T> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name
        .split_whitespace()
        .nth(n.checked_sub(3)?)?
        .parse()
        .ok()
}

/// startcode and startstack (fields 26 and 28) of a /proc/PID/stat line.
fn code_and_stack_starts(stat: &str) -> Option<(u64, u64)> {
    let code = stat_field(stat, 26)?;
    let stack = stat_field(stat, 28)?;
    // The code's start reads as 0 to a reader the process's memory is hidden from (the
    // stack's too), and while an exec has not yet mapped the new image's code.
    (code != 0).then_some((code, stack))
}

/// The parent of `pid` (field 4 of /proc/PID/stat).
pub fn parent_pid(pid: u32) -> Option<u32> {
    stat_field(
        &std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?,
        4,
    )
}

/// The (field, KiB) pairs of /proc/PID/smaps_rollup.
pub fn read_rollup(pid: u32) -> Option<Vec<(String, u64)>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let fields: Vec<(String, u64)> = text
        .lines()
        .filter_map(|line| {
            let (key, rest) = line.split_once(':')?;
            let mut words = rest.split_whitespace();
            let v = words.next()?.parse().ok()?;
            (words.next() == Some("kB")).then(|| (key.trim().to_string(), v))
        })
        .collect();
    (!fields.is_empty()).then_some(fields)
}

/// Parses /proc/PID/maps, looking up build-ids of mapped files (cached by path).
pub fn read_maps(pid: u32, build_ids: &mut HashMap<String, Vec<u8>>) -> Option<Vec<Mapping>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    Some(parse_maps(&text, build_ids))
}

pub fn parse_maps(text: &str, build_ids: &mut HashMap<String, Vec<u8>>) -> Vec<Mapping> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut f = line.splitn(6, ' ');
        let (Some(range), Some(perms), Some(offset), Some(_dev), Some(inode)) =
            (f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            continue;
        };
        let path = f.next().unwrap_or("").trim().to_string();
        let Some((lo, hi)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16))
        else {
            continue;
        };
        let inode: u64 = inode.parse().unwrap_or(0);
        let build_id = if inode != 0 && path.starts_with('/') {
            build_ids
                .entry(path.clone())
                .or_insert_with(|| build_id_of(&path).unwrap_or_default())
                .clone()
        } else {
            Vec::new()
        };
        out.push(Mapping {
            start,
            end,
            perms: perms.to_string(),
            offset: u64::from_str_radix(offset, 16).unwrap_or(0),
            inode,
            path,
            build_id,
        });
    }
    out
}

/// The GNU build-id note of an ELF file. Reads only the headers and the note (through
/// object's read cache): a program maps libraries of many megabytes, and reading them
/// whole cost the recording most of its start-up time.
pub fn build_id_of(path: &str) -> Option<Vec<u8>> {
    use object::Object;
    let cache = object::ReadCache::new(File::open(path).ok()?);
    let file = object::File::parse(&cache).ok()?;
    file.build_id().ok().flatten().map(|b| b.to_vec())
}

/// Whether a mapping can hold heap objects: private, writable, anonymous (the brk heap,
/// allocator arenas and mmap'd blocks), and not fragscope's own or a thread stack.
pub fn may_hold_heap(m: &Mapping) -> bool {
    let p = m.perms.as_bytes();
    p.len() == 4
        && p[0] == b'r'
        && p[1] == b'w'
        && p[3] == b'p'
        && m.inode == 0
        && (m.path.is_empty()
            || m.path == "[heap]"
            || (m.path.starts_with("[anon:") && m.path != "[anon:fragscope]"))
}

/// Page residency of the given mappings from /proc/PID/pagemap (present bit; swapped
/// pages count as not resident), and which resident pages another process maps too (the
/// "exclusively mapped" bit clear, readable without privilege: what smaps counts as
/// Shared_*).
pub fn read_residency(
    pid: u32,
    mappings: &[&Mapping],
    page_size: u64,
) -> Option<Vec<ResidentRange>> {
    let file = File::open(format!("/proc/{pid}/pagemap")).ok()?;
    let mut ranges = Vec::with_capacity(mappings.len());
    let mut entries = vec![0u8; 8 * 4096];
    for m in mappings {
        let first = m.start / page_size;
        let pages = (m.end - m.start) / page_size;
        let mut resident = vec![0u8; pages.div_ceil(8) as usize];
        let mut shared = vec![0u8; pages.div_ceil(8) as usize];
        let mut done = 0u64;
        while done < pages {
            let batch = (pages - done).min(4096);
            let buf = &mut entries[..(batch * 8) as usize];
            if file.read_exact_at(buf, (first + done) * 8).is_err() {
                break; // the mapping went away while we read: keep what we have
            }
            for (i, e) in buf.chunks_exact(8).enumerate() {
                let v = u64::from_le_bytes(e.try_into().unwrap());
                if v >> 63 & 1 == 1 {
                    let page = done + i as u64;
                    resident[(page / 8) as usize] |= 1 << (page % 8);
                    if v >> 56 & 1 == 0 {
                        shared[(page / 8) as usize] |= 1 << (page % 8);
                    }
                }
            }
            done += batch;
        }
        ranges.push(ResidentRange {
            start: m.start,
            pages,
            resident,
            shared,
        });
    }
    Some(ranges)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process that execs, even its own executable again, runs another image.
    #[test]
    fn an_exec_changes_the_image_mark() {
        use std::io::Write;
        use std::process::{Command, Stdio};
        let mut sh = Command::new("sh")
            .args(["-c", "read line; exec sh -c 'read line; exec cat'"])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = sh.id();
        // The mark process `pid` shows once an exec is done: read whole (an exec under
        // way shows its new stack's start before its code's, which reads as not known),
        // the same twice in a row, and other than `before`. Fails if none comes.
        let settled = |before: Option<&ImageMark>| {
            let asked = std::time::Instant::now();
            let mut last = ImageMark::default();
            loop {
                let now = image_mark(pid);
                let whole = now.exe.is_some() && now.code_and_stack.is_some();
                if whole && now == last && Some(&now) != before {
                    return now;
                }
                assert!(asked.elapsed().as_secs() < 10, "the exec left {now:?}");
                last = now;
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        };
        let first = settled(None);
        assert_eq!(first, image_mark(pid));
        assert!(first.exe.is_some() && first.code_and_stack.is_some());
        let mut stdin = sh.stdin.take().unwrap();
        // Lets the shell exec its next image; the mark it then shows.
        let next_image = |stdin: &mut std::process::ChildStdin, before: &ImageMark| {
            writeln!(stdin, "go").unwrap();
            settled(Some(before))
        };
        // The same shell again is told apart by where its stack starts, unless the kernel
        // places it where the last one was (no address randomisation).
        let randomised = std::fs::read_to_string("/proc/sys/kernel/randomize_va_space")
            .is_ok_and(|v| v.trim() != "0");
        let second = if randomised {
            let again = next_image(&mut stdin, &first);
            assert_eq!(again.exe, first.exe);
            again
        } else {
            writeln!(stdin, "go").unwrap();
            first.clone()
        };
        let cat = next_image(&mut stdin, &second);
        assert!(
            cat.exe.as_ref().is_some_and(|e| e.ends_with("cat")),
            "{cat:?}"
        );
        assert!(!first.may_be(&cat) && !second.may_be(&cat));
        // What could not be read does not tell images apart.
        assert!(ImageMark::default().may_be(&cat) && cat.may_be(&ImageMark::default()));
        drop(stdin);
        sh.wait().unwrap();
    }

    #[test]
    fn code_and_stack_are_read_past_a_name_with_parentheses() {
        let stat = "7 (a (b) c) S 1 7 7 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 99 9 9 \
                    18446744073709551615 4096 8192 140000 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0";
        assert_eq!(code_and_stack_starts(stat), Some((4096, 140000)));
        assert_eq!(stat_field::<u32>(stat, 4), Some(1));
        assert_eq!(code_and_stack_starts("7 (cut) S 1 7"), None);
        let hidden = stat.replace("4096 8192 140000", "0 0 0");
        assert_eq!(code_and_stack_starts(&hidden), None);
        let mid_exec = stat.replace("4096 8192 140000", "0 0 140000");
        assert_eq!(code_and_stack_starts(&mid_exec), None);
    }

    #[test]
    fn reads_this_processes_own_proc_files() {
        let pid = std::process::id();
        let rss = read_rss(pid, 7).expect("own status");
        // A field by name, not by a prefix of another ("Tgid" is not "TracerPid").
        assert_eq!(status_field(pid, "Tgid"), Some(pid.to_string()));
        assert_eq!(status_field("self", "Pid"), Some(pid.to_string()));
        assert_eq!(status_field(pid, "Tgi"), None);
        assert!(rss.vm_rss_kib > 0 && rss.tick == 7);
        assert!(rss.rss_anon_kib + rss.rss_file_kib + rss.rss_shmem_kib <= rss.vm_rss_kib + 4);
        let rollup = read_rollup(pid).expect("own smaps_rollup");
        assert!(rollup.iter().any(|(k, v)| k == "Rss" && *v > 0));
        let mut ids = HashMap::new();
        let maps = read_maps(pid, &mut ids).expect("own maps");
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let me = maps
            .iter()
            .find(|m| m.path == exe.to_string_lossy())
            .expect("own executable mapped");
        assert!(!me.build_id.is_empty(), "rustc links a build-id");
        // A fresh 64 KiB block of our own, touched page by page, is resident.
        let block = vec![1u8; 1 << 20];
        let addr = block.as_ptr() as u64;
        let maps = read_maps(pid, &mut ids).unwrap();
        let holder = maps
            .iter()
            .find(|m| m.start <= addr && addr < m.end)
            .unwrap();
        assert!(may_hold_heap(holder), "{holder:?}");
        let ranges = read_residency(pid, &[holder], 4096).unwrap();
        let page = (addr / 4096 + 1) - holder.start / 4096;
        assert!(ranges[0].is_resident(page));
        drop(block);
    }

    #[test]
    fn parses_maps_lines_with_and_without_paths() {
        let text = "55d0c0000000-55d0c0021000 rw-p 00000000 00:00 0                          [heap]\n\
                    7f00000000-7f00001000 r-xp 00001000 fd:01 1234   /usr/lib/x86_64-linux-gnu/libfoo.so (deleted)\n\
                    7f10000000-7f10002000 rw-p 00000000 00:00 0 \n";
        let maps = parse_maps(text, &mut HashMap::new());
        assert_eq!(maps.len(), 3);
        assert_eq!(maps[0].path, "[heap]");
        assert!(may_hold_heap(&maps[0]) && !may_hold_heap(&maps[1]) && may_hold_heap(&maps[2]));
        assert_eq!(maps[1].offset, 0x1000);
        assert_eq!(maps[1].inode, 1234);
    }
}
