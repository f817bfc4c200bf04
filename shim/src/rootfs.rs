//! containerd's snapshot → the guest's read-only erofs root, cached by the snapshot identity.
//!
//! containerd passes the container's root as mounts (`CreateTaskRequest.rootfs`): for the
//! overlay snapshotter one `overlay` mount whose `lowerdir`s are committed snapshot layers
//! (immutable while they exist) and whose `upperdir` is the container's own, normally empty,
//! layer; for others a `bind` of one directory. The identity ([`identity`]) is a sha256 over
//! what makes the tree what it is: each committed layer's path and the inode and change time
//! of its directory (a layer re-created at the same path is a new identity), plus the content
//! key ([`vm_sandbox::mounts::dir_key`]) of anything writable that is not empty (a container's
//! fresh upper layer is empty, so the containers of one image share one root image). When `vm_sandbox`'s
//! [`SnapshotRoots`] has no image for it, the mounts are mounted read-only on the bundle's
//! `rootfs` directory just long enough for `mkfs.erofs` to read the merged tree. The guest then
//! gets that image under the same tmpfs overlay as `--image`: its writes never reach the
//! snapshot.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use containerd_shim::protos::api::Mount as CdMount;
use sha2::{Digest, Sha256};
use vm_sandbox::SnapshotRoots;

use crate::error::ShimError;

/// Cap on the writable part of a snapshot that is walked for the identity (bytes).
const MAX_WRITABLE_BYTES: u64 = 4 << 30;

/// The root of one container: its image and the identity it is cached under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Root {
    pub identity: String,
    pub erofs: PathBuf,
}

fn option<'a>(m: &'a CdMount, key: &str) -> Option<&'a str> {
    m.options
        .iter()
        .find_map(|o| o.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
}

fn hash_dir_identity(h: &mut Sha256, path: &Path) -> Result<(), ShimError> {
    let meta = std::fs::metadata(path)
        .map_err(ShimError::io(format!("snapshot layer {}", path.display())))?;
    h.update(path.as_os_str().as_encoded_bytes());
    h.update([0]);
    for n in [
        meta.dev(),
        meta.ino(),
        meta.ctime() as u64,
        meta.ctime_nsec() as u64,
    ] {
        h.update(n.to_le_bytes());
    }
    Ok(())
}

fn hash_content(h: &mut Sha256, dir: &Path) -> Result<(), ShimError> {
    let key = vm_sandbox::mounts::dir_key(dir, MAX_WRITABLE_BYTES)
        .map_err(ShimError::sandbox("snapshot content key"))?;
    h.update(key.as_bytes());
    Ok(())
}

fn is_empty_dir(dir: &Path) -> Result<bool, ShimError> {
    let mut rd = std::fs::read_dir(dir).map_err(ShimError::io(format!(
        "snapshot upper layer {}",
        dir.display()
    )))?;
    Ok(rd.next().is_none())
}

/// The identity of the snapshot `mounts` describe (`root` when there are none: a bundle
/// whose `root.path` is already populated).
pub fn identity(mounts: &[CdMount], root: &Path) -> Result<String, ShimError> {
    let mut h = Sha256::new();
    h.update(b"containerd-snapshot-v1\0");
    if mounts.is_empty() {
        h.update(b"dir\0");
        hash_content(&mut h, root)?;
    }
    for m in mounts {
        h.update(m.type_.as_bytes());
        h.update([0]);
        match m.type_.as_str() {
            "overlay" => {
                let lower = option(m, "lowerdir")
                    .ok_or_else(|| ShimError::Rootfs("overlay mount without lowerdir".into()))?;
                for layer in lower.split(':') {
                    hash_dir_identity(&mut h, Path::new(layer))?;
                }
                // Each container has its own upper layer, normally empty: an empty one adds
                // nothing, so every container of one image shares one root image.
                if let Some(upper) = option(m, "upperdir")
                    && !is_empty_dir(Path::new(upper))?
                {
                    h.update(b"upper\0");
                    hash_content(&mut h, Path::new(upper))?;
                }
            }
            "bind" | "rbind" => hash_content(&mut h, Path::new(&m.source))?,
            other => {
                return Err(ShimError::Rootfs(format!(
                    "snapshot mount type {other:?} is not supported (overlay or bind)"
                )));
            }
        }
    }
    Ok(hex::encode(h.finalize()))
}

/// The root of a container: the cached image for the snapshot's identity, built from the
/// mounted snapshot when missing. `target` is the bundle's `rootfs` directory.
pub fn prepare(
    cache: &SnapshotRoots,
    mounts: &[CdMount],
    target: &Path,
) -> Result<Root, ShimError> {
    let identity = identity(mounts, target)?;
    let image = cache
        .image_path(&identity)
        .map_err(ShimError::sandbox("snapshot root"))?;
    if image.is_file() {
        return Ok(Root {
            identity,
            erofs: image,
        });
    }
    let _mounted = mount_all(mounts, target)?;
    let erofs = cache
        .erofs_for(&identity, target)
        .map_err(ShimError::sandbox("snapshot root"))?;
    Ok(Root { identity, erofs })
}

/// Mounts on the bundle's `rootfs`, unmounted (in reverse) when dropped.
struct Mounted {
    target: PathBuf,
    count: usize,
}

impl Drop for Mounted {
    fn drop(&mut self) {
        for _ in 0..self.count {
            if let Err(e) = nix::mount::umount2(&self.target, nix::mount::MntFlags::empty()) {
                tracing::warn!(target = %self.target.display(), error = %e, "unmount failed");
            }
        }
    }
}

fn mount_all(mounts: &[CdMount], target: &Path) -> Result<Mounted, ShimError> {
    std::fs::create_dir_all(target).map_err(ShimError::io(format!("{}", target.display())))?;
    let mut mounted = Mounted {
        target: target.to_path_buf(),
        count: 0,
    };
    for m in mounts {
        // Read-only: the image is built from the tree; nothing is written to the snapshot.
        let mut options: Vec<String> = m
            .options
            .iter()
            .filter(|o| o.as_str() != "rw")
            .cloned()
            .collect();
        options.push("ro".into());
        containerd_shim::mount::mount_rootfs(
            Some(m.type_.as_str()),
            Some(m.source.as_str()),
            &options,
            target,
        )
        .map_err(|e| {
            ShimError::Rootfs(format!("mounting {} on {}: {e}", m.type_, target.display()))
        })?;
        mounted.count += 1;
    }
    Ok(mounted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn overlay(lower: &str, upper: &Path) -> CdMount {
        CdMount {
            type_: "overlay".into(),
            source: "overlay".into(),
            options: vec![
                "index=off".into(),
                format!("upperdir={}", upper.display()),
                format!("lowerdir={lower}"),
            ],
            ..Default::default()
        }
    }

    #[test]
    fn identity_follows_layers_and_writable_content() {
        let t = tempfile::tempdir().unwrap();
        let (l1, l2, up) = (
            t.path().join("l1"),
            t.path().join("l2"),
            t.path().join("up"),
        );
        for d in [&l1, &l2, &up] {
            std::fs::create_dir(d).unwrap();
        }
        let lower = format!("{}:{}", l1.display(), l2.display());
        let a = identity(&[overlay(&lower, &up)], t.path()).unwrap();
        assert_eq!(a, identity(&[overlay(&lower, &up)], t.path()).unwrap());
        let other_up = t.path().join("up2");
        std::fs::create_dir(&other_up).unwrap();
        assert_eq!(
            a,
            identity(&[overlay(&lower, &other_up)], t.path()).unwrap(),
            "another container's empty upper layer: the same root"
        );
        let swapped = format!("{}:{}", l2.display(), l1.display());
        assert_ne!(a, identity(&[overlay(&swapped, &up)], t.path()).unwrap());
        std::fs::write(up.join("new"), b"x").unwrap();
        let b = identity(&[overlay(&lower, &up)], t.path()).unwrap();
        assert_ne!(a, b, "a write in the upper layer is a new identity");
        // A layer re-created at the same path is a new identity.
        std::fs::remove_dir(&l2).unwrap();
        std::fs::create_dir(&l2).unwrap();
        assert_ne!(b, identity(&[overlay(&lower, &up)], t.path()).unwrap());
        let e = identity(
            &[CdMount {
                type_: "nfs".into(),
                ..Default::default()
            }],
            t.path(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("\"nfs\" is not supported"), "{e}");
    }
}
