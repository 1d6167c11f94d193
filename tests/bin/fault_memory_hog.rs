//! `fault_memory_hog <floor_mib> <hold_ms> [max_mib]`: kernel memory pressure.
//!
//! Makes itself the OOM killer's first choice (`oom_score_adj` 1000), then takes anonymous
//! memory in 64 MiB chunks, touching every page, until the kernel's `MemAvailable` falls under
//! `floor_mib` (or it holds `max_mib`), holds it for `hold_ms` and exits. The page cache is
//! dropped on the way and every other process competes for what is left; shared segments
//! cannot be reclaimed (there is no swap here), so a process that needs a page during the hold
//! gets one from the floor, or the kernel kills the hog. Prints
//! `holding <bytes> available <bytes>` when it starts holding, and `released` at the end;
//! `tests/tests/fault_harness.rs` (`kmem`) runs it under its workload.

use std::io::Write;
use std::time::Duration;

const CHUNK: usize = 64 << 20;

fn fail(why: String) -> ! {
    eprintln!("fault_memory_hog: {why}");
    std::process::exit(2)
}

/// `MemAvailable` of `/proc/meminfo`, in bytes.
fn available() -> u64 {
    let info = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_else(|e| fail(format!("/proc/meminfo: {e}")));
    info.lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kib| kib * 1024)
        .unwrap_or_else(|| fail("no MemAvailable in /proc/meminfo".into()))
}

/// Maps `CHUNK` bytes of anonymous memory (transparent huge pages where the kernel allows, so
/// a fault takes 2 MiB at a time) and writes one byte in every 4 KiB; kept until exit.
fn take_chunk() {
    // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            CHUNK,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        fail(format!("mmap: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: advice on the mapping just made; failure only means small pages.
    unsafe { libc::madvise(p, CHUNK, libc::MADV_HUGEPAGE) };
    let base = p.cast::<u8>();
    for off in (0..CHUNK).step_by(4096) {
        // SAFETY: off < CHUNK, inside the mapping; a volatile write so the page is taken.
        unsafe { base.add(off).write_volatile(0xa5) };
    }
}

fn arg(args: &[String], i: usize, name: &str) -> u64 {
    args[i]
        .parse()
        .unwrap_or_else(|_| fail(format!("{name} must be a number, got {:?}", args[i])))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if !(3..=4).contains(&args.len()) {
        fail("usage: fault_memory_hog <floor_mib> <hold_ms> [max_mib]".into());
    }
    let floor = arg(&args, 1, "floor_mib") << 20;
    let hold = Duration::from_millis(arg(&args, 2, "hold_ms"));
    let max = if args.len() == 4 {
        arg(&args, 3, "max_mib") << 20
    } else {
        u64::MAX
    };
    // Best effort: without it the kernel may pick another victim, which the harness reports.
    let _ = std::fs::write("/proc/self/oom_score_adj", "1000");
    let mut bytes = 0u64;
    while available() > floor && bytes + CHUNK as u64 <= max {
        take_chunk();
        bytes += CHUNK as u64;
    }
    let mut out = std::io::stdout();
    let _ = writeln!(out, "holding {bytes} available {}", available());
    let _ = out.flush();
    std::thread::sleep(hold);
    // Exiting gives it all back.
    let _ = writeln!(out, "released");
}
