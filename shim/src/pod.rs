//! One microVM per pod: the sandbox boots the pod's VM, and each app container of the pod
//! becomes processes inside it, in a root of its own.
//!
//! Our VMM has no disk hotplug, so the sandbox's VM boots with spare raw disks ([`PodDisks`]:
//! as many as its driver has room for, at most [`MAX_POD_DISKS`]): sparse files on the host
//! (nothing written, no space used), read-only to the guest. When an app container is created its erofs root image (the same image a container
//! with a VM of its own boots from) is copied into a free one and the agent builds the
//! container's root from it (`PodMount::Root`: the erofs under a tmpfs overlay, with its own
//! `/proc`, `/sys` and `/dev`); each of its read-only volumes takes a disk the same way. Its
//! `emptyDir` volumes are tmpfs in the guest shared by the pod's containers (one per host
//! `emptyDir` directory), its kubelet files are copied into its root, and its processes run
//! there (its root as `/`, in mount namespaces of their own) with its environment, working
//! directory and user ([`Member`]), all in one guest cgroup with the container's memory and
//! pids limits. The pod's containers share the VM's loopback and `/dev/shm`. Deleting a
//! container unmounts its root and volumes and frees their disks (a mount that stays busy
//! keeps its disk).

use std::collections::HashMap;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use vm_sandbox::agent::{PodMount, pod_member_cgroup};
use vm_sandbox::{Guest, MemberRoot, MicroVm, MountCache, Options, RawDisk};
use vm_spec::Mount;
use vm_sync::Lock;
use vm_sys::control::Usage;

use crate::bundle::ContainerSpec;
use crate::error::ShimError;

/// Most spare disks a pod's VM boots with: its containers' roots and read-only volumes, at
/// once (kvm has room for 12; QEMU's `microvm` for 6).
pub const MAX_POD_DISKS: usize = 12;
/// The size of each spare disk (sparse: only what is written takes space).
pub const DISK_BYTES: u64 = 64 << 30;
/// Largest single file a read-only file mount of a pod member may be.
pub const MAX_FILE_VOLUME_BYTES: u64 = 16 << 20;
/// Largest cgroup file read for an app container's stats (a guest could put anything there).
const MAX_STAT_FILE_BYTES: u64 = 64 << 10;
/// How long reading an app container's stats may take.
const STATS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// Where the spare disks appear in the guest (`…/disk<N>`).
const GUEST_DISKS: &str = "/run/vm-pod/disk";
/// Where each member's root and volumes are assembled in the guest (`…/c<N>`).
const GUEST_MEMBERS: &str = "/run/vm-pod/c";
/// Where the pod's shared `emptyDir` tmpfs are mounted in the guest (`…/<N>`).
const GUEST_SHARED: &str = "/run/vm-pod/shared";

/// The pods this shim serves, by sandbox id.
pub type PodTable = Arc<Mutex<HashMap<String, Arc<Pod>>>>;

/// The guest path of spare disk `i`.
fn guest_disk(i: usize) -> String {
    format!("{GUEST_DISKS}{i}")
}

/// The spare disks of a pod's VM (see the module docs).
#[derive(Debug)]
pub struct PodDisks {
    dir: PathBuf,
    count: usize,
    free: Mutex<Vec<usize>>,
}

impl PodDisks {
    /// Creates `count` sparse disk files in `dir` (created, mode 0700) and the raw read-only
    /// disks that give them to the VM.
    pub fn create(dir: &Path, count: usize) -> Result<(PodDisks, Vec<RawDisk>), ShimError> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(ShimError::io(format!("creating {}", dir.display())))?;
        let disks = PodDisks {
            dir: dir.to_path_buf(),
            count,
            free: Mutex::new((0..count).rev().collect()),
        };
        let mut mounts = Vec::with_capacity(count);
        for i in 0..count {
            let path = disks.path(i);
            let f = std::fs::File::create(&path)
                .map_err(ShimError::io(format!("creating {}", path.display())))?;
            f.set_len(DISK_BYTES)
                .map_err(ShimError::io(format!("sizing {}", path.display())))?;
            mounts.push(RawDisk {
                host_path: path,
                guest_path: guest_disk(i),
            });
        }
        Ok((disks, mounts))
    }

    fn path(&self, i: usize) -> PathBuf {
        self.dir.join(format!("disk{i}.img"))
    }

    /// Copies `image` into a free disk and returns its number (blocking). The disk holds
    /// nothing else afterwards: what an earlier member left past the image's end is cut off
    /// (truncated to the image, then sparse again to the disk's size), so a container never
    /// reads another's bytes past its own image.
    fn fill(&self, image: &Path) -> Result<usize, ShimError> {
        let mut src =
            std::fs::File::open(image).map_err(ShimError::io(format!("{}", image.display())))?;
        let len = src
            .metadata()
            .map_err(ShimError::io(format!("{}", image.display())))?
            .len();
        if len > DISK_BYTES {
            return Err(ShimError::Refused(format!(
                "{}: {len} bytes is larger than a pod disk ({DISK_BYTES} bytes)",
                image.display()
            )));
        }
        let i = self.free.locked().pop().ok_or_else(|| {
            ShimError::Refused(format!(
                "the pod's {} disks are all in use (a container's root and each of its \
                 read-only volumes take one)",
                self.count
            ))
        })?;
        let path = self.path(i);
        let copied = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|mut dst| {
                dst.rewind()?;
                std::io::copy(&mut src, &mut dst)?;
                dst.set_len(len)?;
                dst.set_len(DISK_BYTES)?;
                dst.flush()
            });
        match copied {
            Ok(()) => Ok(i),
            Err(e) => {
                self.free.locked().push(i);
                Err(ShimError::io(format!("filling {}", path.display()))(e))
            }
        }
    }

    fn give_back(&self, disks: &[usize]) {
        self.free.locked().extend_from_slice(disks);
    }
}

/// A pod's VM and what its members share (see the module docs).
#[derive(Debug)]
pub struct Pod {
    vm: Arc<MicroVm>,
    disks: PodDisks,
    /// Host `emptyDir` directory → the guest tmpfs all members bind.
    shared: tokio::sync::Mutex<HashMap<String, String>>,
    next: AtomicU64,
    /// Each member's tmpfs upper (half the VM's memory, as for the VM's own root).
    upper_bytes: u64,
    mounts: MountCache,
}

/// One app container of a pod: its processes run through [`Member::guest`].
#[derive(Debug)]
pub struct Member {
    pub guest: Guest,
    /// Its own memory limit, bytes (`None`: the pod VM's).
    pub memory_limit: Option<u64>,
    /// Its guest directory (the root is `dir/root`).
    dir: String,
    disks: Mutex<Vec<usize>>,
}

impl Member {
    /// The guest path of `dest` (absolute) inside this member's root.
    pub fn path(&self, dest: &str) -> String {
        format!("{}/root{dest}", self.dir)
    }

    /// What this member's processes use in the guest: its cgroup's CPU time, memory and
    /// process count.
    pub async fn usage(&self, vm: &MicroVm) -> Result<Usage, ShimError> {
        let group = pod_member_cgroup(&self.dir);
        let number = |text: &str| text.trim().parse::<u64>().unwrap_or(0);
        let cpu = cgroup_file(vm, &group, "cpu.stat").await?;
        let field = |key: &str| {
            cpu.lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
                .map(number)
                .unwrap_or(0)
        };
        Ok(Usage {
            processes: number(&cgroup_file(vm, &group, "pids.current").await?),
            user_ns: field("user_usec").saturating_mul(1000),
            system_ns: field("system_usec").saturating_mul(1000),
            rss_bytes: number(&cgroup_file(vm, &group, "memory.current").await?),
        })
    }

    /// How many of this member's processes the OOM killer killed (its cgroup's
    /// `memory.events`, which counts the whole subtree).
    pub async fn oom_kills(&self, vm: &MicroVm) -> Result<u64, ShimError> {
        let events = cgroup_file(vm, &pod_member_cgroup(&self.dir), "memory.events").await?;
        Ok(oom_kills(&events))
    }
}

/// The `oom_kill` count of a cgroup's `memory.events`.
pub fn oom_kills(events: &str) -> u64 {
    events
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// The guest cgroup file `group/name`, read at most [`MAX_STAT_FILE_BYTES`] within
/// [`STATS_TIMEOUT`] (the guest answers it).
pub async fn cgroup_file(vm: &MicroVm, group: &str, name: &str) -> Result<String, ShimError> {
    let path = format!("{group}/{name}");
    let mut bytes = Vec::new();
    let read = vm.copy_out_to(&path, MAX_STAT_FILE_BYTES, &mut bytes);
    tokio::time::timeout(STATS_TIMEOUT, read)
        .await
        .map_err(|_| ShimError::State(format!("reading {path} in the guest timed out")))?
        .map_err(ShimError::sandbox(
            "reading a container's cgroup in the guest",
        ))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// A guest path below `/` without `..` (a member's mount destination).
fn check_dest(dest: &str) -> Result<(), ShimError> {
    let ok = dest.starts_with('/')
        && dest.len() > 1
        && dest[1..].split('/').all(|c| !c.is_empty() && c != "..");
    match ok {
        true => Ok(()),
        false => Err(ShimError::Refused(format!(
            "mount destination {dest:?}: not an absolute path below / without .."
        ))),
    }
}

impl Pod {
    /// The pod whose VM `vm` booted with `disks`.
    pub fn new(vm: Arc<MicroVm>, disks: PodDisks, options: &Options) -> Result<Pod, ShimError> {
        let mem_mib = u64::from(vm.spec().limits().mem_mib);
        let mounts = match &options.mount_cache {
            Some(dir) => MountCache::new(dir),
            None => MountCache::default_location().map_err(ShimError::sandbox("mount cache"))?,
        }
        .with_max_dir_bytes(options.max_mount_bytes);
        Ok(Pod {
            vm,
            disks,
            shared: Default::default(),
            next: AtomicU64::new(0),
            upper_bytes: (mem_mib << 20) / 2,
            mounts,
        })
    }

    pub fn vm(&self) -> &Arc<MicroVm> {
        &self.vm
    }

    /// Fills a free disk with `image` off the async runtime.
    async fn fill(self: &Arc<Self>, image: PathBuf) -> Result<usize, ShimError> {
        let pod = self.clone();
        tokio::task::spawn_blocking(move || pod.disks.fill(&image))
            .await
            .map_err(|e| ShimError::State(format!("filling a pod disk: {e}")))?
    }

    /// Adds the app container `spec` whose root image is `root_image`; on failure whatever
    /// was set up is taken down again.
    pub async fn add(
        self: &Arc<Self>,
        spec: &ContainerSpec,
        root_image: &Path,
    ) -> Result<Member, ShimError> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let dir = format!("{GUEST_MEMBERS}{n}");
        let guest = self.vm.member(MemberRoot {
            dir: format!("{dir}/root"),
            env: spec.process.env.clone(),
            cwd: spec.process.cwd.clone(),
            user: spec.process.user.clone(),
        });
        let member = Member {
            guest,
            memory_limit: spec.mem_mib.map(|m| (m as u64) << 20),
            dir,
            disks: Mutex::new(Vec::new()),
        };
        match self.set_up(&member, spec, root_image).await {
            Ok(()) => Ok(member),
            Err(e) => {
                self.remove(&member).await;
                Err(e)
            }
        }
    }

    async fn set_up(
        self: &Arc<Self>,
        m: &Member,
        spec: &ContainerSpec,
        root_image: &Path,
    ) -> Result<(), ShimError> {
        let i = self.fill(root_image.to_path_buf()).await?;
        m.disks.locked().push(i);
        self.mount(PodMount::Root {
            device: guest_disk(i),
            dir: m.dir.clone(),
            upper_bytes: self.upper_bytes,
            memory_bytes: m.memory_limit,
            pids: spec.pids.map(|p| p as u64),
            cpu_max: spec.cpu_max,
        })
        .await?;
        for (k, v) in spec.mounts.iter().enumerate() {
            check_dest(&v.guest_path)?;
            self.volume(m, k, v).await?;
        }
        for t in &spec.tmpfs {
            check_dest(&t.dest)?;
            let dest = m.path(&t.dest);
            match &t.shared_as {
                None => self
                    .vm
                    .mount_tmpfs(&dest, t.size_bytes)
                    .await
                    .map_err(ShimError::sandbox("mounting a tmpfs in the guest"))?,
                Some(host) => {
                    let source = self.shared_dir(host, t.size_bytes).await?;
                    self.mount(PodMount::Bind { source, path: dest }).await?;
                }
            }
        }
        for f in &spec.files {
            let dest = m.path(&f.dest);
            self.vm
                .write_absolute(&dest, &f.data)
                .await
                .map_err(ShimError::sandbox("copying a kubelet file into the guest"))?;
            self.vm
                .set_mode(&dest, f.mode)
                .await
                .map_err(ShimError::sandbox("copying a kubelet file into the guest"))?;
        }
        Ok(())
    }

    async fn mount(&self, m: PodMount) -> Result<(), ShimError> {
        self.vm.pod_mount(m).await.map_err(ShimError::sandbox(
            "setting up the container in the pod's VM",
        ))
    }

    /// Read-only volume `k` of member `m`: a directory's erofs on a disk of its own; a file
    /// is put alone in a directory first and then bound at its destination.
    async fn volume(self: &Arc<Self>, m: &Member, k: usize, v: &Mount) -> Result<(), ShimError> {
        let (host, mounts, stage) = (
            v.host_path.clone(),
            self.mounts.clone(),
            self.disks.dir.clone(),
        );
        let image = tokio::task::spawn_blocking(move || volume_image(&host, &mounts, &stage))
            .await
            .map_err(|e| ShimError::State(format!("building a volume: {e}")))??;
        let i = self.fill(image.erofs).await?;
        m.disks.locked().push(i);
        let device = guest_disk(i);
        match image.file_name {
            None => {
                let path = m.path(&v.guest_path);
                self.mount(PodMount::Volume { device, path }).await
            }
            Some(name) => {
                let at = format!("{}/v{k}", m.dir);
                self.mount(PodMount::Volume {
                    device,
                    path: at.clone(),
                })
                .await?;
                let (source, path) = (format!("{at}/{name}"), m.path(&v.guest_path));
                self.mount(PodMount::Bind { source, path }).await
            }
        }
    }

    /// The guest tmpfs every member binds for the host `emptyDir` `host` (mounted by the
    /// first).
    async fn shared_dir(&self, host: &str, size_bytes: u64) -> Result<String, ShimError> {
        let mut shared = self.shared.lock().await;
        if let Some(dir) = shared.get(host) {
            return Ok(dir.clone());
        }
        let dir = format!("{GUEST_SHARED}/{}", shared.len());
        self.vm
            .mount_tmpfs(&dir, size_bytes)
            .await
            .map_err(ShimError::sandbox("mounting a pod's emptyDir"))?;
        shared.insert(host.to_string(), dir.clone());
        Ok(dir)
    }

    /// Takes member `m`'s mounts down and frees its disks (kept when a mount stays busy).
    pub async fn remove(&self, m: &Member) {
        let path = m.dir.clone();
        match self.vm.pod_mount(PodMount::Unmount { path }).await {
            Ok(()) => self
                .disks
                .give_back(&std::mem::take(&mut *m.disks.locked())),
            Err(e) => tracing::warn!(
                dir = m.dir,
                error = %vm_error_chain::error_chain(&e),
                "a pod member's mounts stay; its disks are not reused"
            ),
        }
    }
}

/// A volume's erofs image, and the name of the single file in it when the volume is a file.
struct VolumeImage {
    erofs: PathBuf,
    file_name: Option<String>,
}

/// The erofs of the host directory `host`, or of a directory holding only the host file
/// `host` (copied into a staging directory under `stage`, at most
/// [`MAX_FILE_VOLUME_BYTES`]).
fn volume_image(host: &Path, mounts: &MountCache, stage: &Path) -> Result<VolumeImage, ShimError> {
    let meta = std::fs::metadata(host).map_err(ShimError::io(format!("{}", host.display())))?;
    let erofs = |dir: &Path| {
        mounts
            .erofs_for_dir(dir)
            .map_err(ShimError::sandbox("building a volume image"))
    };
    if meta.is_dir() {
        return Ok(VolumeImage {
            erofs: erofs(host)?,
            file_name: None,
        });
    }
    let name = host
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| !n.contains('/'))
        .ok_or_else(|| ShimError::Refused(format!("{}: no file name", host.display())))?;
    let dir = tempfile::Builder::new()
        .prefix("vol-")
        .tempdir_in(stage)
        .map_err(ShimError::io(format!("staging {}", host.display())))?;
    let mut data = Vec::new();
    std::fs::File::open(host)
        .and_then(|f| f.take(MAX_FILE_VOLUME_BYTES + 1).read_to_end(&mut data))
        .map_err(ShimError::io(format!("{}", host.display())))?;
    if data.len() as u64 > MAX_FILE_VOLUME_BYTES {
        return Err(ShimError::Refused(format!(
            "{}: a read-only file mount of a pod's container is at most {MAX_FILE_VOLUME_BYTES} bytes",
            host.display()
        )));
    }
    let staged = dir.path().join(name);
    std::fs::write(&staged, &data).map_err(ShimError::io(format!("{}", staged.display())))?;
    Ok(VolumeImage {
        erofs: erofs(dir.path())?,
        file_name: Some(name.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disks_are_sparse_and_handed_out_until_none_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let (disks, mounts) = PodDisks::create(&dir.path().join("pod"), 6).unwrap();
        assert_eq!(mounts.len(), 6);
        assert_eq!(mounts[3].guest_path, "/run/vm-pod/disk3");
        let meta = std::fs::metadata(&mounts[0].host_path).unwrap();
        assert_eq!(meta.len(), DISK_BYTES);
        assert_eq!(std::os::unix::fs::MetadataExt::blocks(&meta), 0, "sparse");

        let image = dir.path().join("root.erofs");
        std::fs::write(&image, b"erofs image bytes").unwrap();
        let taken: Vec<usize> = (0..6).map(|_| disks.fill(&image).unwrap()).collect();
        assert_eq!(taken, [0, 1, 2, 3, 4, 5], "lowest first");
        let mut head = vec![0u8; 17];
        std::fs::File::open(&mounts[5].host_path)
            .unwrap()
            .read_exact(&mut head)
            .unwrap();
        assert_eq!(head, b"erofs image bytes");
        let e = disks.fill(&image).unwrap_err().to_string();
        assert!(e.contains("6 disks are all in use"), "{e}");
        disks.give_back(&[4]);
        assert_eq!(disks.fill(&image).unwrap(), 4);
    }

    /// Issue 39: a reused disk keeps nothing of the member before, past the new image's end.
    #[test]
    fn a_reused_disk_holds_only_the_new_image() {
        let dir = tempfile::tempdir().unwrap();
        let (disks, mounts) = PodDisks::create(&dir.path().join("pod"), 1).unwrap();
        let long = dir.path().join("long.erofs");
        std::fs::write(&long, vec![b'S'; 1 << 20]).unwrap();
        assert_eq!(disks.fill(&long).unwrap(), 0);
        disks.give_back(&[0]);
        let short = dir.path().join("short.erofs");
        std::fs::write(&short, b"new image").unwrap();
        assert_eq!(disks.fill(&short).unwrap(), 0);
        let mut all = Vec::new();
        std::fs::File::open(&mounts[0].host_path)
            .unwrap()
            .take(2 << 20)
            .read_to_end(&mut all)
            .unwrap();
        assert_eq!(&all[..9], b"new image");
        assert!(
            all[9..].iter().all(|b| *b == 0),
            "the earlier member's bytes are gone"
        );
        let meta = std::fs::metadata(&mounts[0].host_path).unwrap();
        assert_eq!(meta.len(), DISK_BYTES);
    }

    #[test]
    fn a_file_volume_is_staged_alone_and_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secrets");
        std::fs::create_dir(&secret).unwrap();
        std::fs::write(secret.join("token"), b"t0ken").unwrap();
        std::fs::write(secret.join("other"), b"not this").unwrap();
        let cache = MountCache::new(dir.path().join("cache"));
        let img = volume_image(&secret.join("token"), &cache, dir.path()).unwrap();
        assert_eq!(img.file_name.as_deref(), Some("token"));
        assert!(img.erofs.is_file());

        let big = dir.path().join("big");
        let f = std::fs::File::create(&big).unwrap();
        f.set_len(MAX_FILE_VOLUME_BYTES + 1).unwrap();
        let e = volume_image(&big, &cache, dir.path())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("at most"), "{e}");
    }

    #[test]
    fn oom_kills_are_read_from_memory_events() {
        let events = "low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(oom_kills(events), 1);
        assert_eq!(oom_kills("oom_kill_other 3\n"), 0);
        assert_eq!(oom_kills(""), 0);
    }

    #[test]
    fn member_destinations_stay_below_the_root() {
        for bad in ["", "/", "rel", "/a/../..", "/a//b"] {
            assert!(check_dest(bad).is_err(), "{bad:?}");
        }
        check_dest("/etc/config").unwrap();
    }
}
