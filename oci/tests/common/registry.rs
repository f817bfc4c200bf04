//! A real registry (Debian's `docker-registry`) on a free 127.0.0.1 port with its storage in
//! a temp dir (optionally wanting HTTP basic auth), and `skopeo` to push test images to it.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Registry {
    child: Child,
    /// `127.0.0.1:PORT`
    pub addr: String,
    pub dir: tempfile::TempDir,
}

impl Registry {
    /// Starts a registry; panics when it does not answer within 20 s.
    pub fn start() -> Registry {
        Self::start_with(None)
    }

    /// A registry that wants HTTP basic auth for `user:password`, or `None` when this host
    /// cannot make the bcrypt hash (python3's `crypt` module).
    pub fn start_with_auth(user: &str, password: &str) -> Option<Registry> {
        let script = "import crypt,sys; print(crypt.crypt(sys.argv[1], crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16)))";
        let out = Command::new("python3")
            .args(["-W", "ignore", "-c", script, password])
            .output()
            .ok()?;
        let hash = String::from_utf8(out.stdout).ok()?;
        if !out.status.success() || !hash.starts_with("$2") {
            return None;
        }
        Some(Self::start_with(Some(format!("{user}:{}", hash.trim()))))
    }

    fn start_with(htpasswd: Option<String>) -> Registry {
        let dir = tempfile::tempdir().unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let cfg = dir.path().join("config.yml");
        let mut yml = format!(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n",
            dir.path().join("data").display()
        );
        if let Some(line) = htpasswd {
            let file = dir.path().join("htpasswd");
            std::fs::write(&file, format!("{line}\n")).unwrap();
            yml.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: vm-test\n    path: {}\n",
                file.display()
            ));
        }
        std::fs::write(&cfg, yml).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&cfg)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("registry.log")).unwrap())
            .spawn()
            .expect("starting docker-registry");
        let reg = Registry { child, addr, dir };
        let deadline = Instant::now() + Duration::from_secs(20);
        while reg.get("/v2/").is_none() {
            assert!(
                Instant::now() < deadline,
                "docker-registry did not answer on {}",
                reg.addr
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        reg
    }

    /// A plain HTTP GET; the status line, if anything answered.
    pub fn get(&self, path: &str) -> Option<String> {
        let mut s = TcpStream::connect(&self.addr).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", self.addr).ok()?;
        let mut buf = String::new();
        s.read_to_string(&mut buf).ok()?;
        buf.lines().next().map(str::to_owned)
    }

    /// Pushes the layout at `layout` (tag `tag`) as `name:tag`, in Docker v2s2 when asked.
    pub fn push(&self, layout: &Path, tag: &str, name: &str, v2s2: bool) {
        self.push_as(layout, tag, name, v2s2, None);
    }

    /// [`Registry::push`] with `user:password` credentials.
    pub fn push_as(&self, layout: &Path, tag: &str, name: &str, v2s2: bool, creds: Option<&str>) {
        let mut cmd = Command::new("skopeo");
        cmd.args([
            "--insecure-policy",
            "copy",
            "--quiet",
            "--dest-tls-verify=false",
        ]);
        if let Some(c) = creds {
            cmd.arg(format!("--dest-creds={c}"));
        }
        cmd.args(["--format", if v2s2 { "v2s2" } else { "oci" }])
            .arg("--all")
            .arg(format!("oci:{}:{tag}", layout.display()))
            .arg(format!("docker://{}/{name}:{tag}", self.addr));
        let out = cmd.output().expect("running skopeo");
        assert!(
            out.status.success(),
            "skopeo copy failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The registry's stored file for blob `digest` (`sha256:<hex>`).
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = &digest[7..];
        self.dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
