//! Prints one census of a running SBCL process's dynamic space:
//! `sbcl_census PID [--objects|--mark]` (with `--objects`, every object is walked too;
//! with `--mark`, the objects reachable from the roots are marked as well, and each
//! generation's live and garbage bytes are printed).
use std::process::ExitCode;

use fragscope_census::sbcl::{census, CensusOptions, ObjectClass, PageType, SbclRuntime};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sbcl_census: {e}");
            ExitCode::FAILURE
        }
    }
}

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let pid: u32 = args
        .next()
        .and_then(|a| a.parse().ok())
        .ok_or("usage: sbcl_census PID [--objects|--mark]")?;
    let args: Vec<String> = args.collect();
    let objects = args.iter().any(|a| a == "--objects");
    let mark = args.iter().any(|a| a == "--mark");
    let rt = SbclRuntime::of_process(pid)?;
    let c = census(
        pid,
        &rt,
        CensusOptions {
            objects,
            mark,
            ..Default::default()
        },
    )
    .map_err(|e| e.to_string())?;
    println!(
        "SBCL {}: dynamic space {:#x}, {:.1} MiB in {} pages of {} KiB",
        c.version,
        c.dynamic_space_start,
        mib(c.dynamic_space_size),
        c.page_table_pages,
        c.page_bytes >> 10
    );
    println!(
        "pages: {} in use, {} free below next_free_page {}, {} never used",
        c.pages_in_use, c.pages_free, c.next_free_page, c.pages_never_used
    );
    println!(
        "bytes allocated {} ({:.1} MiB) on {:.1} MiB of pages; {} open regions hold {} more bytes; {} collections",
        c.bytes_allocated,
        mib(c.bytes_allocated),
        mib(c.pages_in_use * c.page_bytes),
        c.open_regions.len(),
        c.open_region_bytes,
        c.collections
    );
    println!("gen  pages    used bytes   held MiB  large pages  gcs  promote-after  trigger MiB");
    for g in &c.generations {
        println!(
            "{:>3} {:>6} {:>13} {:>10.1} {:>12} {:>4} {:>14} {:>12.1}",
            g.gen,
            g.pages.pages,
            g.pages.bytes_used,
            mib(g.pages.bytes_held()),
            g.pages.large_pages,
            g.num_gc,
            g.number_of_gcs_before_promotion,
            mib(g.gc_trigger)
        );
    }
    for t in PageType::ALL {
        let f = c.page_type(t);
        println!(
            "{:<12} {:>6} pages {:>10.1} MiB used of {:>10.1}",
            t.name(),
            f.pages,
            mib(f.bytes_used),
            mib(f.bytes_held())
        );
    }
    println!(
        "occupancy (no byte, 0-10% .. 90-100%): {:?}",
        c.occupancy_pages
    );
    if let Some(o) = &c.objects {
        for k in ObjectClass::ALL {
            let f = o.class(k);
            println!(
                "{:<14} {:>10} objects {:>14} bytes",
                k.name(),
                f.count,
                f.bytes
            );
        }
        for (w, f) in o.by_widetag.iter().enumerate().filter(|(_, f)| f.count > 0) {
            println!(
                "  widetag {w:>3} {:>10} objects {:>14} bytes",
                f.count, f.bytes
            );
        }
        println!("fillers {} bytes; walk {} us", o.filler_bytes, o.walk_us);
        if let Some(m) = &c.mark {
            println!("gen  class           live bytes    garbage bytes");
            for g in 0..o.by_generation.len() {
                for k in ObjectClass::ALL {
                    let all = o.by_generation[g][k.index_in_all()].bytes;
                    if all > 0 {
                        println!(
                            "{g:>3}  {:<14} {:>12} {:>16}",
                            k.name(),
                            m.live(g, k).bytes,
                            m.garbage(o, g, k)
                        );
                    }
                }
            }
            let live: u64 = (0..6).map(|g| m.live_bytes(g)).sum();
            println!(
                "live in generations 0-5: {live} bytes ({:.1} MiB); roots {:?}",
                mib(live),
                m.roots
            );
            println!(
                "mark {} us: {:.1} ms per 100 MiB in use (the walk not included)",
                m.mark_us,
                m.mark_us as f64 / 1000.0 / (mib(c.bytes_allocated.max(1)) / 100.0)
            );
        }
    }
    if let Some(e) = &c.mark_refused {
        println!("no mark: {e}");
    }
    let per_100 = c.pause_us as f64 / 1000.0 / (mib(c.bytes_allocated.max(1)) / 100.0);
    println!(
        "pause {} us for {:.1} MiB in use: {:.2} ms per 100 MiB; {} bytes read",
        c.pause_us,
        mib(c.bytes_allocated),
        per_100,
        c.bytes_read
    );
    Ok(())
}
