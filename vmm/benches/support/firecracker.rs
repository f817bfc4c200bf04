//! Firecracker beside `vm-vmm` in the restore bench: the same tiny guest, snapshotted once
//! through Firecracker's API, then restored as many times as ours, round by round.
//!
//! Firecracker boots an ELF, not raw code, so the guest's bytes are wrapped in a one-segment
//! ELF loaded at 16 MiB. A restore is timed from the spawn to `PUT /snapshot/load` (with
//! `resume_vm`) answered 204: Firecracker answers once its vCPU has acknowledged the resume.
//! Its snapshot carries the serial port's scratch register, so the restored guest goes on
//! waiting and prints nothing; ours is timed to the restored guest's own `R`, a later point,
//! so the ratio errs against ours.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where the guest is loaded (and the ELF's single segment starts).
const LOAD_ADDR: u64 = 0x100_0000;
/// The ELF header and its one program header, before the code.
const HEADERS: u64 = 64 + 56;

/// `code` as an x86-64 ELF executable whose one `PT_LOAD` segment (headers and code) is loaded
/// at [`LOAD_ADDR`], entered at the code.
pub fn elf(code: &[u8]) -> Vec<u8> {
    let size = HEADERS + code.len() as u64;
    let mut e = Vec::with_capacity(size as usize);
    e.extend_from_slice(b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0"); // 64-bit, LE, v1
    e.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    e.extend_from_slice(&62u16.to_le_bytes()); // EM_X86_64
    e.extend_from_slice(&1u32.to_le_bytes()); // EV_CURRENT
    e.extend_from_slice(&(LOAD_ADDR + HEADERS).to_le_bytes()); // entry
    e.extend_from_slice(&64u64.to_le_bytes()); // program headers at 64
    e.extend_from_slice(&0u64.to_le_bytes()); // no section headers
    e.extend_from_slice(&0u32.to_le_bytes()); // flags
    for half in [64u16, 56, 1, 64, 0, 0] {
        // header size, phentsize, phnum, shentsize, shnum, shstrndx
        e.extend_from_slice(&half.to_le_bytes());
    }
    e.extend_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    e.extend_from_slice(&7u32.to_le_bytes()); // RWX
    for word in [0, LOAD_ADDR, LOAD_ADDR, size, size, 0x1000] {
        // offset, vaddr, paddr, filesz, memsz, align
        e.extend_from_slice(&word.to_le_bytes());
    }
    e.extend_from_slice(code);
    e
}

/// One Firecracker process listening on its API socket, its console piped.
struct Firecracker {
    child: Child,
    console: BufReader<std::process::ChildStdout>,
    socket: PathBuf,
    t0: Instant,
}

impl Firecracker {
    /// Firecracker itself, its API socket at `socket`.
    fn spawn(bin: &Path, socket: &Path) -> Self {
        let _ = std::fs::remove_file(socket);
        let mut cmd = Command::new(bin);
        cmd.arg("--api-sock").arg(socket).args(["--level", "Off"]);
        Self::start(cmd, socket)
    }

    /// Runs `cmd` (Firecracker, or its jailer), whose API socket will be at `socket`.
    fn start(mut cmd: Command, socket: &Path) -> Self {
        let t0 = Instant::now();
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn firecracker");
        let console = BufReader::new(child.stdout.take().expect("piped stdout"));
        Firecracker {
            child,
            console,
            socket: socket.to_path_buf(),
            t0,
        }
    }

    /// One API call; panics unless it is answered 204. The socket is polled until it accepts.
    fn call(&self, method: &str, path: &str, body: &str) {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut s = loop {
            match UnixStream::connect(&self.socket) {
                Ok(s) => break s,
                Err(e) if Instant::now() > deadline => panic!("firecracker's API socket: {e}"),
                Err(_) => std::thread::sleep(Duration::from_micros(50)),
            }
        };
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .expect("API request");
        let mut head = [0u8; 12];
        s.read_exact(&mut head).expect("API response");
        let status = String::from_utf8_lossy(&head[9..12]).into_owned();
        if status != "204" {
            let mut rest = String::new();
            let _ = s.read_to_string(&mut rest);
            panic!("{method} {path}: {status} {rest}");
        }
    }

    fn until_line(&mut self, want: &str) -> Duration {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.console.read_line(&mut line).expect("console");
            assert!(n > 0, "firecracker's console ended before {want:?}");
            if line.trim_end() == want {
                return self.t0.elapsed();
            }
        }
    }
}

impl Drop for Firecracker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The snapshot of one guest, taken by Firecracker, and the binary that restores it.
pub struct Arm {
    bin: PathBuf,
    dir: PathBuf,
}

impl Arm {
    /// Boots `code` (as [`elf`]) in Firecracker (1 vCPU, 128 MiB), waits for its `B`, pauses
    /// it and writes a full snapshot into `dir`.
    pub fn snapshot(bin: &Path, code: &[u8], dir: &Path) -> Self {
        let kernel = dir.join("guest.elf");
        std::fs::write(&kernel, elf(code)).expect("the guest's ELF");
        let mut fc = Firecracker::spawn(bin, &dir.join("boot.sock"));
        fc.call(
            "PUT",
            "/boot-source",
            &format!(r#"{{"kernel_image_path":"{}"}}"#, kernel.display()),
        );
        fc.call(
            "PUT",
            "/machine-config",
            r#"{"vcpu_count":1,"mem_size_mib":128}"#,
        );
        fc.call("PUT", "/actions", r#"{"action_type":"InstanceStart"}"#);
        fc.until_line("B");
        fc.call("PATCH", "/vm", r#"{"state":"Paused"}"#);
        fc.call(
            "PUT",
            "/snapshot/create",
            &format!(
                r#"{{"snapshot_type":"Full","snapshot_path":"{}","mem_file_path":"{}"}}"#,
                dir.join("vmstate").display(),
                dir.join("memory").display()
            ),
        );
        Arm {
            bin: bin.to_path_buf(),
            dir: dir.to_path_buf(),
        }
    }

    /// One restore: spawn → `PUT /snapshot/load` answered; then the process is killed.
    pub fn restore(&self) -> Duration {
        let fc = Firecracker::spawn(&self.bin, &self.dir.join("restore.sock"));
        load(&fc, &self.dir.join("vmstate"), &self.dir.join("memory"));
        fc.t0.elapsed()
    }

    /// One restore through Firecracker's jailer (a chroot of its own, uid/gid 1234, a new PID
    /// namespace, `netns`): jailer spawn → `PUT /snapshot/load` answered. The chroot is made
    /// before the clock starts: the snapshot files hard-linked in and, for a dynamically
    /// linked build, its libraries copied in (a musl build needs none).
    pub fn restore_jailed(&self, jailer: &Path, netns: &Path, n: u32) -> Duration {
        let base = self.dir.join("jails");
        let id = format!("r{n}");
        let jail = base.join("firecracker").join(&id);
        let root = jail.join("root");
        std::fs::create_dir_all(&root).expect("the chroot");
        for file in ["vmstate", "memory"] {
            std::fs::hard_link(self.dir.join(file), root.join(file)).expect("the snapshot");
        }
        for lib in libraries(&self.bin) {
            let to = root.join(lib.strip_prefix("/").expect("an absolute path"));
            std::fs::create_dir_all(to.parent().expect("a parent")).expect("lib dir");
            std::fs::copy(&lib, &to).expect("a library");
        }
        let mut cmd = Command::new(jailer);
        cmd.args([
            "--id",
            &id,
            "--uid",
            "1234",
            "--gid",
            "1234",
            "--cgroup-version",
            "2",
        ])
        .arg("--exec-file")
        .arg(&self.bin)
        .arg("--chroot-base-dir")
        .arg(&base)
        .arg("--netns")
        .arg(netns)
        .args([
            "--new-pid-ns",
            "--",
            "--api-sock",
            "/run/api.sock",
            "--level",
            "Off",
        ]);
        let fc = Firecracker::start(cmd, &root.join("run/api.sock"));
        load(&fc, Path::new("/vmstate"), Path::new("/memory"));
        let took = fc.t0.elapsed();
        // The jailer forked Firecracker into its PID namespace; the pid file has its host pid.
        if let Some(pid) = std::fs::read_to_string(root.join("firecracker.pid"))
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok())
        {
            // SAFETY: kill(2) on the Firecracker process this restore started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        drop(fc);
        let _ = std::fs::remove_dir_all(&jail);
        took
    }
}

/// `PUT /snapshot/load` of `state` and `memory` (as Firecracker sees them), resumed.
fn load(fc: &Firecracker, state: &Path, memory: &Path) {
    fc.call(
        "PUT",
        "/snapshot/load",
        &format!(
            r#"{{"snapshot_path":"{}","mem_backend":{{"backend_type":"File","backend_path":"{}"}},"resume_vm":true}}"#,
            state.display(),
            memory.display()
        ),
    );
}

/// The shared libraries and loader `bin` needs, as `ldd` lists them (none for a static one).
fn libraries(bin: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd").arg(bin).output().expect("ldd");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter(|w| w.starts_with('/'))
        .map(PathBuf::from)
        .collect()
}
