//! A real containerd 1.6 **with its CRI plugin**, started by the test in a temp dir (its own
//! root, state, socket, CNI config and IPAM state) inside a network namespace the test creates
//! (`unshare --net`; `lo` brought up there): the CNI bridge, the pods' veths and the CRI's
//! streaming server all live in that namespace, so nothing reaches the host's network.
//!
//! The `vm` runtime is configured with the TOML snippet of `docs/containerd.md` (between the
//! `cri-config` markers), as written: only its `ConfigPath` is pointed at the shim options
//! file this test writes. The RuntimeClass's `handler` is read from the same document. The
//! shim under test is found on containerd's `PATH` as `containerd-shim-vm-v1`, as an
//! installed one would be. The busybox image is imported into the CRI's `k8s.io` namespace
//! (`ctr images import`: there is no registry to pull from offline) and is the
//! `sandbox_image` too, its command `sleep` standing in for `pause`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{self, oci_common};

/// The image every CRI test runs (and the pods' sandbox image).
pub const IMAGE: &str = "example.com/cri/box:1";

/// containerd's namespace for the CRI's containers and images.
pub const K8S_NS: &str = "k8s.io";

/// The CNI plugins the bridge network needs (`loopback`: containerd's CRI sets up every
/// pod's `lo` with it).
pub const CNI_PLUGINS: &[&str] = &["bridge", "host-local", "loopback"];

/// Where Debian's `containernetworking-plugins` installs them.
pub const CNI_BIN_DIR: &str = "/usr/lib/cni";

/// The shim options file the documented snippet names; the test substitutes its own.
const DOC_CONFIG_PATH: &str = "/etc/containerd-shim-vm/config.toml";

/// Why this host cannot run the CRI tests (a fact about the host), if it cannot.
pub fn host_cannot() -> Option<String> {
    if let Some(why) = common::host_cannot() {
        return Some(why);
    }
    for tool in ["unshare", "ip", "nsenter", "curl"] {
        if !oci_common::have(tool) {
            return Some(format!(
                "{tool} is not installed (util-linux, iproute2, curl)"
            ));
        }
    }
    let netns = Command::new("unshare")
        .args(["--net", "--", "ip", "link", "set", "lo", "up"])
        .stdin(Stdio::null())
        .output();
    match netns {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            return Some(format!(
                "cannot make a network namespace (unshare --net): {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        Err(e) => return Some(format!("cannot run unshare: {e}")),
    }
    for plugin in CNI_PLUGINS {
        if !Path::new(CNI_BIN_DIR).join(plugin).exists() {
            return Some(format!(
                "{CNI_BIN_DIR}/{plugin} is missing (containernetworking-plugins)"
            ));
        }
    }
    None
}

/// `docs/containerd.md`.
fn containerd_doc() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/containerd.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The fenced block of `lang` that follows the `<!-- NAME -->` marker in `doc` (up to its
/// closing fence).
pub fn doc_block(doc: &str, name: &str, lang: &str) -> String {
    let marker = format!("<!-- {name} -->");
    let after = doc
        .split_once(&marker)
        .unwrap_or_else(|| panic!("docs/containerd.md has no {marker}"))
        .1;
    let fence = format!("```{lang}\n");
    let body = after
        .trim_start()
        .strip_prefix(&fence)
        .unwrap_or_else(|| panic!("{marker} is not followed by a ```{lang} block"));
    let end = body
        .find("\n```")
        .unwrap_or_else(|| panic!("the block after {marker} is not closed"));
    body[..end + 1].to_string()
}

/// The containerd CRI configuration of `docs/containerd.md`, with `shim_config` as the
/// runtime's `ConfigPath` (the only value a host changes).
pub fn doc_cri_config(shim_config: &Path) -> String {
    let toml = doc_block(&containerd_doc(), "cri-config", "toml");
    assert_eq!(
        toml.matches(DOC_CONFIG_PATH).count(),
        1,
        "the documented snippet names {DOC_CONFIG_PATH} once:\n{toml}"
    );
    toml.replace(DOC_CONFIG_PATH, &shim_config.to_string_lossy())
}

/// The RuntimeClass's `handler` in `docs/containerd.md` (what kubelet sends as
/// `runtime_handler`).
pub fn doc_runtime_handler() -> String {
    let yaml = doc_block(&containerd_doc(), "runtime-class", "yaml");
    assert!(
        yaml.contains("kind: RuntimeClass"),
        "not a RuntimeClass:\n{yaml}"
    );
    yaml.lines()
        .find_map(|l| l.trim().strip_prefix("handler:"))
        .map(|h| h.split('#').next().unwrap_or("").trim().to_string())
        .unwrap_or_else(|| panic!("the RuntimeClass has no handler:\n{yaml}"))
}

/// One containerd with its CRI, and everything it keeps, in one temp dir.
pub struct CriContainerd {
    pub dir: tempfile::TempDir,
    child: Option<Child>,
}

impl CriContainerd {
    /// Writes the configs, starts containerd in a new network namespace, waits for its CRI
    /// and imports [`IMAGE`] into `k8s.io`.
    pub fn start() -> CriContainerd {
        let dir = tempfile::Builder::new()
            .prefix("shim-cri-")
            .tempdir()
            .expect("a temp dir");
        let d = dir.path();
        for sub in ["root", "state", "run", "snapshots", "cni", "ipam", "pods"] {
            std::fs::create_dir_all(d.join(sub)).expect("a test directory");
        }
        std::fs::write(d.join("shim.toml"), shim_options(d)).expect("shim.toml");
        std::fs::write(d.join("cni/10-vmtest.conflist"), cni_conflist(d)).expect("conflist");
        let config = containerd_config(d, &doc_cri_config(&d.join("shim.toml")));
        std::fs::write(d.join("config.toml"), config).expect("config.toml");
        let mut c = CriContainerd { dir, child: None };
        c.spawn();
        c.import();
        c
    }

    /// containerd's gRPC socket (the CRI's too).
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("c.sock")
    }

    fn spawn(&mut self) {
        let d = self.dir.path();
        let log = common::append_log(&d.join("containerd.log"));
        // The shim under test is `containerd-shim-vm-v1` on containerd's PATH.
        let shim_dir = Path::new(common::shim_bin())
            .parent()
            .expect("the shim's directory");
        let path = format!(
            "{}:{}",
            shim_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let child = Command::new("unshare")
            .args([
                "--net",
                "--",
                "sh",
                "-c",
                "ip link set lo up && exec \"$@\"",
                "sh",
            ])
            .arg("containerd")
            .arg("--config")
            .arg(d.join("config.toml"))
            .env("PATH", path)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("starting containerd in a new network namespace");
        self.child = Some(child);
        self.wait_for(60, "containerd to answer", || {
            self.ctr(&["version"]).code == 0
        });
    }

    /// containerd's pid (its network namespace is the node's).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("containerd runs").id()
    }

    /// `argv` run in containerd's network namespace (the node's, to the pods: the CNI bridge
    /// and its gateway address live there).
    pub fn in_node_net(&self, argv: &[&str]) -> common::Out {
        let pid = self.pid();
        common::Out::from(
            Command::new("nsenter")
                .arg(format!("--net=/proc/{pid}/ns/net"))
                .args(argv)
                .stdin(Stdio::null())
                .output()
                .expect("running nsenter"),
        )
    }

    /// `ctr` against this containerd, in the CRI's namespace.
    pub fn ctr(&self, args: &[&str]) -> common::Out {
        common::Out::from(
            Command::new("ctr")
                .arg("-a")
                .arg(self.socket())
                .args(["-n", K8S_NS])
                .args(args)
                .stdin(Stdio::null())
                .output()
                .expect("running ctr"),
        )
    }

    fn import(&self) {
        let layout = self.dir.path().join("layout");
        common::busybox_image_with(serde_json::json!({
            "Env": ["PATH=/bin"],
            "Cmd": ["sleep", "2147483647"],
        }))
        .write_layout(&layout, "1");
        let archive = self.dir.path().join("image.tar");
        oci_common::tar_dir(&layout, &archive);
        let base = IMAGE.rsplit_once(':').expect("IMAGE has a tag").0;
        let archive = archive.to_string_lossy();
        let out = self.ctr(&["images", "import", "--base-name", base, &archive]);
        assert_eq!(
            out.code,
            0,
            "ctr images import: {out:?}\n{}",
            self.log_tail()
        );
    }

    /// containerd's log (the shim logs into it too).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
    }

    /// The last 6000 bytes of containerd's log, for failure messages.
    pub fn log_tail(&self) -> String {
        format!(
            "containerd's log ends:\n{}",
            common::tail(&self.log(), 6000)
        )
    }

    /// Parent of the VMs' run directories (from `shim.toml`).
    pub fn run_dir(&self) -> PathBuf {
        self.dir.path().join("run")
    }

    /// The snapshot root cache's references (from `shim.toml`).
    pub fn root_refs(&self) -> PathBuf {
        self.dir.path().join("snapshots/refs")
    }

    /// A kubelet-like pod directory (`pods/<uid>`), created.
    pub fn pod_dir(&self, uid: &str) -> PathBuf {
        let p = self.dir.path().join("pods").join(uid);
        std::fs::create_dir_all(&p).expect("a pod directory");
        p
    }

    /// The shim processes serving this containerd.
    pub fn shim_pids(&self) -> Vec<u32> {
        common::shim_pids_for(&self.socket())
    }

    /// The VM processes (QEMU or `vm-vmm`) this containerd's shims started.
    pub fn vm_pids(&self) -> Vec<u32> {
        let shims = self.shim_pids();
        all_pids()
            .into_iter()
            .filter(|p| is_vm_process(*p) && has_ancestor(*p, &shims))
            .collect()
    }

    /// The shim sockets left for `ids` in `k8s.io` (the shim's address for a group id).
    pub fn leftover_sockets(&self, ids: &[&str]) -> Vec<String> {
        let sock = self.socket();
        ids.iter()
            .map(|id| containerd_shim::socket_address(&sock.to_string_lossy(), K8S_NS, id))
            .map(|a| a.strip_prefix("unix://").unwrap_or(&a).to_string())
            .filter(|p| Path::new(p).exists())
            .collect()
    }

    /// Polls `cond` for `secs` at most; a timeout fails with containerd's log tail.
    pub fn wait_for(&self, secs: u64, what: &str, cond: impl FnMut() -> bool) {
        assert!(
            poll(secs, cond),
            "timed out waiting for {what}; {}",
            self.log_tail()
        );
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // unshare exec'd sh, which exec'd containerd: the child's pid is containerd's.
            // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let _ = c.wait();
        }
    }
}

impl Drop for CriContainerd {
    /// Prints containerd's log tail when the test failed, ends the shims this containerd
    /// started (their VMs die with them) and containerd, then detaches whatever is still
    /// mounted under the temp dir (a failed test's sandbox shm and network namespaces) so
    /// that the dir can go.
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.log_tail());
        }
        for pid in self.shim_pids() {
            // SAFETY: kill(2) on a shim process this test's containerd started.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        self.stop();
        let mut mounts = mounts_under(self.dir.path());
        mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in mounts {
            let _ = nix::mount::umount2(m.as_str(), nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// The shim options the test's containers run under: emulation allowed (these hosts have no
/// hardware boundary), run dirs and the snapshot cache in the temp dir, which is also
/// kubelet's root (its pods' directories are `pods/<uid>` there: [`Containerd::pod_dir`]).
fn shim_options(d: &Path) -> String {
    format!(
        "allow_emulation = true\nrun_dir = \"{}\"\nsnapshot_cache = \"{}\"\nkubelet_root = \"{}\"\n",
        d.join("run").display(),
        d.join("snapshots").display(),
        d.display()
    )
}

/// A bridge network (`vmtest0`, host-local IPAM with its state in the temp dir); no default
/// route and no masquerade: pods reach only each other and the bridge, all inside the test's
/// network namespace.
fn cni_conflist(d: &Path) -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "vmtest",
        "plugins": [{
            "type": "bridge",
            "bridge": "vmtest0",
            "isGateway": true,
            "ipMasq": false,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": "10.99.0.0/24"}]],
                "dataDir": d.join("ipam"),
            },
        }],
    })
    .to_string()
}

/// containerd's config: this test's root, state, socket and CNI directories and sandbox
/// image, the default `runc` runtime a node's config has (never used here; without any
/// `runtimes.runc` table the CRI refuses its default `default_runtime_name = "runc"`), then
/// `runtime` (the documented snippet) as written.
fn containerd_config(d: &Path, runtime: &str) -> String {
    let cri = "plugins.\"io.containerd.grpc.v1.cri\"";
    format!(
        "version = 2\nroot = \"{root}\"\nstate = \"{state}\"\n\
         disabled_plugins = [\"io.containerd.snapshotter.v1.aufs\", \
         \"io.containerd.snapshotter.v1.btrfs\", \"io.containerd.snapshotter.v1.zfs\", \
         \"io.containerd.snapshotter.v1.devmapper\", \"io.containerd.internal.v1.opt\", \
         \"io.containerd.tracing.processor.v1.otlp\"]\n\
         [grpc]\n  address = \"{sock}\"\n[metrics]\n  address = \"\"\n\
         [{cri}]\n  sandbox_image = \"{IMAGE}\"\n  netns_mounts_under_state_dir = true\n  \
         disable_apparmor = true\n  stream_server_address = \"127.0.0.1\"\n  \
         stream_server_port = \"0\"\n\
         [{cri}.cni]\n  bin_dir = \"{CNI_BIN_DIR}\"\n  conf_dir = \"{cni}\"\n\
         [{cri}.containerd]\n  snapshotter = \"overlayfs\"\n\
         [{cri}.containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n\
         # From docs/containerd.md, as written:\n{runtime}",
        root = d.join("root").display(),
        state = d.join("state").display(),
        sock = d.join("c.sock").display(),
        cni = d.join("cni").display(),
    )
}

/// Polls `cond` every 200 ms for `secs` at most: whether it held.
pub fn poll(secs: u64, cond: impl FnMut() -> bool) -> bool {
    poll_every(Duration::from_millis(200), secs, cond)
}

/// Polls `cond` every `interval` for `secs` at most: whether it held.
pub fn poll_every(interval: Duration, secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(interval);
    }
}

fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `pid` is a VM (QEMU's or `vm-vmm`'s process), alive.
fn is_vm_process(pid: u32) -> bool {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let comm = comm.trim_end();
    (comm.starts_with("qemu-system") || comm == "vm-vmm") && common::alive(pid)
}

/// Whether one of `pid`'s ancestors is in `of`.
fn has_ancestor(pid: u32, of: &[u32]) -> bool {
    let mut p = pid;
    for _ in 0..64 {
        match common::parent_pid(p) {
            Some(parent) if of.contains(&parent) => return true,
            Some(parent) if parent > 1 => p = parent,
            _ => return false,
        }
    }
    false
}

/// Mount points at or below `dir` (`/proc/self/mountinfo`'s fifth field).
pub fn mounts_under(dir: &Path) -> Vec<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let dir = dir.to_string_lossy();
    info.lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .filter(|m| m.starts_with(dir.as_ref()))
        .map(str::to_string)
        .collect()
}
