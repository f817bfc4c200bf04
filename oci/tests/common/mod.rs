//! Test images written offline (our own small writer: raw tar headers, so hostile entries can
//! be expressed), their three local forms, and reading an erofs image back.
#![allow(dead_code)]

pub mod registry;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use flate2::Compression;
use flate2::write::GzEncoder;
use sha2::{Digest as _, Sha256};

/// One tar stream built entry by entry.
pub struct Layer {
    tar: Vec<u8>,
}

impl Default for Layer {
    fn default() -> Self {
        Self::new()
    }
}

impl Layer {
    pub fn new() -> Self {
        Self { tar: Vec::new() }
    }

    /// An entry with a raw path (written as-is, `..` and absolute paths included).
    pub fn raw(
        mut self,
        path: &str,
        kind: tar::EntryType,
        mode: u32,
        owner: (u64, u64),
        link: Option<&str>,
        data: &[u8],
    ) -> Self {
        let mut h = tar::Header::new_gnu();
        {
            let gnu = h.as_gnu_mut().unwrap();
            assert!(
                path.len() < gnu.name.len(),
                "path too long for the test writer"
            );
            gnu.name[..path.len()].copy_from_slice(path.as_bytes());
            if let Some(l) = link {
                gnu.linkname[..l.len()].copy_from_slice(l.as_bytes());
            }
        }
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(owner.0);
        h.set_gid(owner.1);
        h.set_mtime(1_700_000_000);
        h.set_size(data.len() as u64);
        if matches!(kind, tar::EntryType::Char | tar::EntryType::Block) {
            h.set_device_major(1).unwrap();
            h.set_device_minor(3).unwrap();
        }
        h.set_cksum();
        self.tar.extend_from_slice(h.as_bytes());
        self.tar.extend_from_slice(data);
        let pad = (512 - data.len() % 512) % 512;
        self.tar.extend(std::iter::repeat_n(0u8, pad));
        self
    }

    /// A PAX extended header (`key=value` records) applying to the next entry.
    pub fn pax(self, records: &[(&str, &[u8])]) -> Self {
        let mut body = Vec::new();
        for (k, v) in records {
            let rest = k.len() + v.len() + 3; // ' ', '=', '\n'
            let mut len = rest + 1;
            while len != rest + len.to_string().len() {
                len = rest + len.to_string().len();
            }
            body.extend_from_slice(format!("{len} {k}=").as_bytes());
            body.extend_from_slice(v);
            body.push(b'\n');
        }
        self.raw("pax", tar::EntryType::XHeader, 0o644, (0, 0), None, &body)
    }

    pub fn dir(self, path: &str, mode: u32) -> Self {
        self.raw(path, tar::EntryType::Directory, mode, (0, 0), None, b"")
    }
    pub fn file(self, path: &str, data: &[u8]) -> Self {
        self.raw(path, tar::EntryType::Regular, 0o644, (0, 0), None, data)
    }
    pub fn file_as(self, path: &str, mode: u32, owner: (u64, u64), data: &[u8]) -> Self {
        self.raw(path, tar::EntryType::Regular, mode, owner, None, data)
    }
    pub fn symlink(self, path: &str, target: &str) -> Self {
        self.raw(
            path,
            tar::EntryType::Symlink,
            0o777,
            (0, 0),
            Some(target),
            b"",
        )
    }
    pub fn hardlink(self, path: &str, target: &str) -> Self {
        self.raw(path, tar::EntryType::Link, 0o644, (0, 0), Some(target), b"")
    }

    /// The finished tar (two zero blocks at the end).
    pub fn tar(&self) -> Vec<u8> {
        let mut t = self.tar.clone();
        t.extend(std::iter::repeat_n(0u8, 1024));
        t
    }

    pub fn gzip(&self) -> Vec<u8> {
        gzip(&self.tar())
    }
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = GzEncoder::new(Vec::new(), Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

pub fn sha(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

/// An image: a config and gzip layers (each blob with its uncompressed tar).
pub struct TestImage {
    pub config: Vec<u8>,
    /// (compressed blob, uncompressed tar)
    pub layers: Vec<(Vec<u8>, Vec<u8>)>,
}

impl TestImage {
    /// `process` is the config's `config` object.
    pub fn new(layers: &[Layer], process: serde_json::Value) -> Self {
        let layers: Vec<(Vec<u8>, Vec<u8>)> = layers.iter().map(|l| (l.gzip(), l.tar())).collect();
        Self::from_blobs(layers, process)
    }

    pub fn from_blobs(layers: Vec<(Vec<u8>, Vec<u8>)>, process: serde_json::Value) -> Self {
        let diff_ids: Vec<String> = layers.iter().map(|(_, t)| sha(t)).collect();
        let config = serde_json::to_vec(&serde_json::json!({
            "architecture": "amd64", "os": "linux", "config": process,
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }))
        .unwrap();
        Self { config, layers }
    }

    pub fn manifest(&self) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": sha(&self.config), "size": self.config.len()},
            "layers": self.layers.iter().map(|(b, _)| serde_json::json!({
                "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                "digest": sha(b), "size": b.len()})).collect::<Vec<_>>(),
        }))
        .unwrap()
    }

    pub fn manifest_digest(&self) -> String {
        sha(&self.manifest())
    }

    /// Writes an OCI image layout at `dir` tagged `tag`.
    pub fn write_layout(&self, dir: &Path, tag: &str) {
        let blobs = dir.join("blobs/sha256");
        std::fs::create_dir_all(&blobs).unwrap();
        let put = |data: &[u8]| {
            let d = sha(data);
            std::fs::write(blobs.join(&d[7..]), data).unwrap();
            d
        };
        put(&self.config);
        for (b, _) in &self.layers {
            put(b);
        }
        let m = self.manifest();
        put(&m);
        std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
        let index = serde_json::json!({"schemaVersion": 2, "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": sha(&m), "size": m.len(),
            "annotations": {"org.opencontainers.image.ref.name": tag}}]});
        std::fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    }

    /// Writes a `docker save`-style tarball (uncompressed layer tars) at `path`.
    pub fn write_docker_save(&self, path: &Path, repo_tag: &str) {
        let mut b = tar::Builder::new(std::fs::File::create(path).unwrap());
        let mut add = |name: &str, data: &[u8]| {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, name, data).unwrap();
        };
        let cfg_name = format!("{}.json", &sha(&self.config)[7..]);
        add(&cfg_name, &self.config);
        let mut names = Vec::new();
        for (_, t) in &self.layers {
            let n = format!("{}/layer.tar", &sha(t)[7..19]);
            add(&n, t);
            names.push(n);
        }
        let m = serde_json::json!([{"Config": cfg_name, "RepoTags": [repo_tag], "Layers": names}]);
        add("manifest.json", &serde_json::to_vec(&m).unwrap());
        b.into_inner().unwrap();
    }
}

/// Tars the directory `dir` into `out` (an `oci-archive`).
pub fn tar_dir(dir: &Path, out: &Path) {
    let mut b = tar::Builder::new(std::fs::File::create(out).unwrap());
    b.append_dir_all(".", dir).unwrap();
    b.into_inner().unwrap();
}

/// Extracts the erofs image into a fresh directory with `fsck.erofs --extract`.
pub fn extract(erofs: &Path, into: &Path) -> PathBuf {
    let out = into.join("extracted");
    let st = Command::new("fsck.erofs")
        .arg(format!("--extract={}", out.display()))
        .arg(erofs)
        .status()
        .unwrap();
    assert!(st.success(), "fsck.erofs --extract failed");
    out
}

/// `dump.erofs --path=P`: the inode's NID and link count.
pub fn inode(erofs: &Path, path: &str) -> (u64, u64) {
    let out = Command::new("dump.erofs")
        .arg(format!("--path={path}"))
        .arg(erofs)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |k: &str| -> u64 {
        let i = text.find(k).unwrap_or_else(|| panic!("{k} not in {text}")) + k.len();
        text[i..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    (field("NID:"), field("Links:"))
}

/// Whether `tool` is on PATH.
pub fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool} >/dev/null")])
        .status()
        .is_ok_and(|s| s.success())
}

/// Why this host cannot convert images, if it cannot (counted as a skip by the caller).
pub fn cannot_convert() -> Option<String> {
    for t in ["mkfs.erofs", "fsck.erofs", "dump.erofs"] {
        if !have(t) {
            return Some(format!("{t} not installed (erofs-utils)"));
        }
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("converting keeps image file owners, which needs root".into());
    }
    None
}

/// The sample image: two layers where the second deletes a file (whiteout), replaces a
/// directory's contents (opaque) and a file; a hardlink, a symlink, a file owned by
/// 1000:1000, a setuid file and a device node; a config with every process default.
pub fn sample() -> TestImage {
    let l1 = Layer::new()
        .dir("etc/", 0o755)
        .file("etc/hostname", b"sample\n")
        .file("etc/gone", b"to be deleted")
        .dir("srv/", 0o755)
        .dir("srv/data/", 0o750)
        .file("srv/data/old.txt", b"old")
        .raw(
            "home/app/",
            tar::EntryType::Directory,
            0o700,
            (1000, 1000),
            None,
            b"",
        )
        .file_as("home/app/owned.txt", 0o640, (1000, 1000), b"mine")
        .file_as("bin/tool", 0o755, (0, 0), b"#!/bin/sh\necho tool\n")
        .hardlink("bin/tool-link", "bin/tool")
        .symlink("bin/alias", "tool")
        .file_as("bin/suid", 0o4755, (0, 0), b"suid")
        .raw("dev/null2", tar::EntryType::Char, 0o666, (0, 0), None, b"");
    let l2 = Layer::new()
        .file("etc/.wh.gone", b"")
        .dir("srv/data/", 0o755)
        .file("srv/data/.wh..wh..opq", b"")
        .file("srv/data/new.txt", b"new")
        .file("etc/hostname", b"changed\n");
    TestImage::new(&[l1, l2], sample_process())
}

pub fn sample_process() -> serde_json::Value {
    serde_json::json!({
        "Env": ["PATH=/usr/bin:/bin", "GREETING=hi"],
        "WorkingDir": "/srv", "User": "1000:1000",
        "Entrypoint": ["/bin/tool"], "Cmd": ["--help"],
    })
}

/// Asserts the sample image's flattened tree, read back from its erofs file.
pub fn assert_sample_tree(erofs: &Path, scratch: &Path) {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let root = extract(erofs, scratch);
    let read = |p: &str| std::fs::read(root.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
    assert!(
        !root.join("etc/gone").exists(),
        "whiteout did not delete etc/gone"
    );
    assert!(
        !root.join("srv/data/old.txt").exists(),
        "opaque dir kept old.txt"
    );
    assert_eq!(read("srv/data/new.txt"), b"new");
    assert_eq!(read("etc/hostname"), b"changed\n");
    let owned = std::fs::metadata(root.join("home/app/owned.txt")).unwrap();
    assert_eq!(
        (owned.uid(), owned.gid(), owned.mode() & 0o7777),
        (1000, 1000, 0o640)
    );
    let home = std::fs::metadata(root.join("home/app")).unwrap();
    assert_eq!((home.uid(), home.mode() & 0o7777), (1000, 0o700));
    let suid = std::fs::metadata(root.join("bin/suid")).unwrap();
    assert_eq!(suid.permissions().mode() & 0o7777, 0o755, "setuid bit kept");
    assert!(!root.join("dev/null2").exists(), "device node kept");
    assert_eq!(
        std::fs::read_link(root.join("bin/alias")).unwrap(),
        Path::new("tool")
    );
    let (nid, links) = inode(erofs, "/bin/tool");
    assert_eq!(inode(erofs, "/bin/tool-link"), (nid, 2));
    assert_eq!(links, 2);
    assert_eq!(read("bin/tool-link"), b"#!/bin/sh\necho tool\n");
}

/// An error and its sources, joined by `: `.
#[allow(unused_imports)] // not every test binary renders errors
pub use vm_error_chain::error_chain;
