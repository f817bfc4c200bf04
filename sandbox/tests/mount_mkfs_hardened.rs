//! A `-v` directory mount's `mkfs.erofs` runs in the hardened child every erofs build shares
//! (`vm_oci::build_erofs_with`): `no_new_privs`, and — where this process may drop them
//! (root) — only `CAP_DAC_READ_SEARCH` in its bounding set. A stand-in `mkfs.erofs` first on
//! `PATH` records what it was given. One test in this binary: it sets `PATH` for the process.

use std::fs;
use std::os::unix::fs::PermissionsExt;

use vm_sandbox::mounts::MountCache;

#[test]
fn directory_mounts_run_mkfs_erofs_without_privileges() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("bin");
    fs::create_dir(&bin).unwrap();
    let record = tmp.path().join("record");
    // The stand-in: its own NoNewPrivs and CapBnd (inherited from the child it runs as), its
    // arguments, and an image file at the output path (its second-to-last argument).
    let script = format!(
        "#!/bin/sh\n\
         grep -E '^(NoNewPrivs|CapBnd):' /proc/self/status > '{rec}'\n\
         echo \"args: $*\" >> '{rec}'\n\
         for a; do out=$prev; prev=$a; done\n\
         echo image > \"$out\"\n",
        rec = record.display()
    );
    let fake = bin.join("mkfs.erofs");
    fs::write(&fake, script).unwrap();
    fs::set_permissions(&fake, fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // SAFETY: the only test in this binary, before any thread of its own is started.
    unsafe { std::env::set_var("PATH", path) };

    let src = tmp.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("f"), b"data").unwrap();
    let image = MountCache::new(tmp.path().join("cache"))
        .erofs_for_dir(&src)
        .unwrap();
    assert_eq!(fs::read(&image).unwrap(), b"image\n");

    let rec = fs::read_to_string(&record).unwrap();
    assert!(rec.contains("NoNewPrivs:\t1"), "{rec}");
    assert!(
        rec.contains("--all-root -x-1 ") && rec.ends_with(&format!("{}\n", src.display())),
        "{rec}"
    );
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        // Bit 2 alone: CAP_DAC_READ_SEARCH.
        assert!(rec.contains("CapBnd:\t0000000000000004"), "{rec}");
    }
}
