//! The shim ([`VmShim`]: containerd's `start`/`delete` actions and the serving process) and
//! its task service ([`TaskService`]: create, start, state, wait, kill, delete, pids, exec,
//! resize_pty, close_io, pause, resume, stats, connect, shutdown), with the
//! TaskCreate/TaskStart/TaskExit/TaskPaused/TaskResumed events.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use containerd_shim::api::{self, Status as ApiStatus};
use containerd_shim::asynchronous::{ExitSignal, Shim, spawn};
use containerd_shim::protos::events::task::{
    TaskCreate, TaskDelete, TaskExecAdded, TaskExecStarted, TaskExit, TaskIO, TaskOOM, TaskPaused,
    TaskResumed, TaskStart,
};
use containerd_shim::protos::protobuf::MessageDyn;
use containerd_shim::protos::protobuf::well_known_types::timestamp::Timestamp;
use containerd_shim::protos::topics;
use containerd_shim::protos::ttrpc::context::Context;
use containerd_shim::publisher::RemotePublisher;
use containerd_shim::{Config, Flags, StartOpts, Task, TtrpcContext, TtrpcResult};
use vm_sync::Lock;

use crate::container::{Container, CreateRequest, HostState};
use crate::error::ShimError;
use crate::options::{self, CONFIG_PATH_ENV};
use crate::pod::PodTable;
use crate::process::{KILLED, Process, Status, Stdio};

/// How long `delete` waits for a killed shim to be gone before it sweeps the run directories
/// (a process with VMs to tear down takes a moment to exit).
const SHIM_EXIT_GRACE: Duration = Duration::from_secs(10);

/// The shim process (see the module docs).
#[derive(Clone)]
pub struct VmShim {
    exit: Arc<ExitSignal>,
    namespace: String,
    /// The ttrpc socket this shim serves (`unix://…`), removed when it exits.
    socket: String,
    config_path: Option<PathBuf>,
}

#[async_trait]
impl Shim for VmShim {
    type T = TaskService;

    async fn new(_runtime_id: &str, args: &Flags, _config: &mut Config) -> Self {
        VmShim {
            exit: Arc::new(ExitSignal::default()),
            namespace: args.namespace.clone(),
            socket: args.socket.clone(),
            config_path: std::env::var_os(CONFIG_PATH_ENV)
                .filter(|p| !p.is_empty())
                .map(PathBuf::from),
        }
    }

    /// containerd's `start`: read the runtime options from stdin (before the crate's own
    /// cgroup step reads it as runc's), start the serving shim and write `address`.
    async fn start_shim(&mut self, opts: StartOpts) -> Result<String, containerd_shim::Error> {
        let data = tokio::task::spawn_blocking(|| {
            let mut d = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut d).map(|_| d)
        })
        .await
        .map_err(|e| containerd_shim::Error::Other(e.to_string()))?
        .map_err(|e| containerd_shim::Error::Other(format!("reading options: {e}")))?;
        let path = options::config_path_from_bytes(&data)
            .map_err(|e| containerd_shim::Error::InvalidArgument(e.to_string()))?;
        let path = path.map(|p| p.display().to_string()).unwrap_or_default();
        // A pod's app container is served by its pod's shim (the one holding the pod's VM).
        let bundle = std::env::current_dir()
            .map_err(|e| containerd_shim::Error::Other(format!("the bundle directory: {e}")))?;
        let grouping = crate::bundle::pod::grouping(&bundle, &opts.id);
        let vars = vec![(CONFIG_PATH_ENV, path.as_str())];
        let address = spawn(opts, &grouping, vars).await?;
        containerd_shim::asynchronous::util::write_str_to_file("address", &address).await?;
        Ok(address)
    }

    /// containerd's `delete` after the shim died: undo what the bundle's state file records
    /// (the root reference), remove run directories whose owner died, unmount the rootfs.
    async fn delete_shim(&mut self) -> Result<api::DeleteResponse, containerd_shim::Error> {
        let bundle =
            std::env::current_dir().map_err(|e| containerd_shim::Error::Other(e.to_string()))?;
        let mut shim_alive = false;
        if let Some(host) = HostState::read(&bundle) {
            host.release(&bundle);
            // containerd saw the dead shim's socket close, which happens before the shim is
            // a zombie: until then the sweep would take its run directory for a live one's.
            if let Some(shim) = host.shim {
                let gone = tokio::task::spawn_blocking(move || shim.wait_gone(SHIM_EXIT_GRACE));
                shim_alive = !gone.await.unwrap_or(false);
                if shim_alive {
                    tracing::warn!(pid = shim.pid, "the shim is still alive; its run dir stays");
                }
            }
            vm_sandbox::rundir::sweep(&host.run_dir_parent);
        }
        let _ = nix::mount::umount2(&bundle.join("rootfs"), nix::mount::MntFlags::MNT_DETACH);
        // A pod's app container names its pod's shim, which may still serve the pod (containerd
        // runs this action for each container whose connection it closed, alive or not).
        if !shim_alive && let Ok(address) = std::fs::read_to_string(bundle.join("address")) {
            remove_dead_socket(address.trim());
        }
        Ok(api::DeleteResponse {
            exit_status: KILLED,
            exited_at: Some(timestamp(SystemTime::now())).into(),
            ..Default::default()
        })
    }

    /// Until `shutdown`; then the socket goes (containerd has removed the bundle, and with
    /// it the `address` file the crate would look for).
    async fn wait(&mut self) {
        self.exit.wait().await;
        remove_socket(&self.socket);
    }

    async fn create_task_service(&self, publisher: RemotePublisher) -> TaskService {
        TaskService {
            shim: self.clone(),
            publisher: Arc::new(publisher),
            containers: Arc::new(Mutex::new(HashMap::new())),
            pods: Arc::new(Mutex::new(HashMap::new())),
        }
    }
}

/// Removes the Unix socket a `unix://PATH` address names unless a live shim still answers
/// on it.
fn remove_dead_socket(address: &str) {
    let path = address.strip_prefix("unix://").unwrap_or(address);
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        tracing::info!(address, "a live shim serves this socket; it stays");
        return;
    }
    remove_socket(address);
}

/// Removes the Unix socket a `unix://PATH` address names, if it is one.
fn remove_socket(address: &str) {
    use std::os::unix::fs::FileTypeExt;
    let path = address.strip_prefix("unix://").unwrap_or(address);
    if path.is_empty() {
        return;
    }
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = std::fs::remove_file(path);
    }
}

fn timestamp(t: SystemTime) -> Timestamp {
    Timestamp::from(t)
}

/// The task service containerd talks to (see the module docs).
#[derive(Clone)]
pub struct TaskService {
    shim: VmShim,
    publisher: Arc<RemotePublisher>,
    containers: Arc<Mutex<HashMap<String, Arc<Container>>>>,
    pods: PodTable,
}

impl TaskService {
    fn container(&self, id: &str) -> Result<Arc<Container>, ShimError> {
        self.containers
            .locked()
            .get(id)
            .cloned()
            .ok_or_else(|| ShimError::NotFound(format!("container {id:?}")))
    }

    async fn publish(&self, topic: &str, event: Box<dyn MessageDyn>) {
        if let Err(e) = self
            .publisher
            .publish(Context::default(), topic, &self.shim.namespace, event)
            .await
        {
            tracing::warn!(topic, error = %e, "publishing event");
        }
    }

    /// Publishes `TaskExit` when `p` ends (before `wait` answers, so containerd has the event
    /// before it deletes; `TaskOOM` first when the init process was killed by the OOM killer);
    /// for the init process then tears the VM down.
    fn watch_exit(&self, c: Arc<Container>, p: Arc<Process>) {
        let svc = self.clone();
        tokio::spawn(async move {
            let exit = p.wait().await;
            // containerd's CRI makes `OOMKilled` the reason of an exit it heard of as an OOM
            // first.
            if p.exec_id.is_empty() && exit.code == KILLED && c.oom_killed().await {
                let ev = TaskOOM {
                    container_id: c.id.clone(),
                    ..Default::default()
                };
                svc.publish(topics::TASK_OOM_EVENT_TOPIC, Box::new(ev))
                    .await;
            }
            let ev = TaskExit {
                container_id: c.id.clone(),
                id: match p.exec_id.is_empty() {
                    true => c.id.clone(),
                    false => p.exec_id.clone(),
                },
                pid: c.pid,
                exit_status: exit.code,
                exited_at: Some(timestamp(exit.at)).into(),
                ..Default::default()
            };
            svc.publish(topics::TASK_EXIT_EVENT_TOPIC, Box::new(ev))
                .await;
            if p.exec_id.is_empty() {
                c.init_ended().await;
                if let Some(t) = c.termination_message() {
                    tracing::info!(
                        container = %c.id,
                        truncated = t.truncated,
                        termination_message = ?t.message,
                        "termination message"
                    );
                }
            }
            p.set_reported();
        });
    }

    async fn do_create(
        &self,
        req: api::CreateTaskRequest,
    ) -> Result<api::CreateTaskResponse, ShimError> {
        if !req.checkpoint.is_empty() {
            return Err(ShimError::Unsupported("checkpoint/restore".into()));
        }
        let path = match req.options.as_ref() {
            Some(any) => options::config_path_from_any(any)?.or(self.shim.config_path.clone()),
            None => self.shim.config_path.clone(),
        };
        let config = options::resolve(path.as_deref())?;
        let stdio = Stdio {
            stdin: req.stdin.clone(),
            stdout: req.stdout.clone(),
            stderr: req.stderr.clone(),
            terminal: req.terminal,
        };
        let c = Container::create(CreateRequest {
            namespace: self.shim.namespace.clone(),
            id: req.id.clone(),
            bundle: PathBuf::from(&req.bundle),
            rootfs: req.rootfs.clone(),
            stdio: stdio.clone(),
            config,
            pods: self.pods.clone(),
        })
        .await?;
        let pid = c.pid;
        let c = Arc::new(c);
        self.containers.locked().insert(req.id.clone(), c.clone());
        self.watch_exit(c.clone(), c.init.clone());
        let ev = TaskCreate {
            container_id: req.id.clone(),
            bundle: req.bundle.clone(),
            rootfs: req.rootfs.clone(),
            io: Some(TaskIO {
                stdin: stdio.stdin,
                stdout: stdio.stdout,
                stderr: stdio.stderr,
                terminal: stdio.terminal,
                ..Default::default()
            })
            .into(),
            pid,
            ..Default::default()
        };
        self.publish(topics::TASK_CREATE_EVENT_TOPIC, Box::new(ev))
            .await;
        Ok(api::CreateTaskResponse {
            pid,
            ..Default::default()
        })
    }

    async fn do_start(&self, req: api::StartRequest) -> Result<api::StartResponse, ShimError> {
        let c = self.container(&req.id)?;
        c.start(&req.exec_id).await?;
        if req.exec_id.is_empty() {
            let ev = TaskStart {
                container_id: c.id.clone(),
                pid: c.pid,
                ..Default::default()
            };
            self.publish(topics::TASK_START_EVENT_TOPIC, Box::new(ev))
                .await;
        } else {
            let ev = TaskExecStarted {
                container_id: c.id.clone(),
                exec_id: req.exec_id.clone(),
                pid: c.pid,
                ..Default::default()
            };
            self.publish(topics::TASK_EXEC_STARTED_EVENT_TOPIC, Box::new(ev))
                .await;
        }
        Ok(api::StartResponse {
            pid: c.pid,
            ..Default::default()
        })
    }

    fn do_state(&self, req: api::StateRequest) -> Result<api::StateResponse, ShimError> {
        let c = self.container(&req.id)?;
        let p = c.process(&req.exec_id)?;
        let status = match p.status() {
            Status::Created => ApiStatus::CREATED,
            Status::Running if c.is_paused() => ApiStatus::PAUSED,
            Status::Running => ApiStatus::RUNNING,
            Status::Stopped => ApiStatus::STOPPED,
        };
        let exit = p.exit();
        Ok(api::StateResponse {
            id: req.id.clone(),
            bundle: c.bundle.display().to_string(),
            pid: c.pid,
            status: status.into(),
            stdin: p.stdio.stdin.clone(),
            stdout: p.stdio.stdout.clone(),
            stderr: p.stdio.stderr.clone(),
            terminal: p.stdio.terminal,
            exit_status: exit.map(|e| e.code).unwrap_or(0),
            exited_at: exit.map(|e| timestamp(e.at)).into(),
            exec_id: req.exec_id.clone(),
            ..Default::default()
        })
    }

    async fn do_kill(&self, req: api::KillRequest) -> Result<(), ShimError> {
        let c = self.container(&req.id)?;
        let p = c.process(&req.exec_id)?;
        let signal = i32::try_from(req.signal)
            .ok()
            .filter(|s| (1..=vm_sandbox::agent::MAX_SIGNAL).contains(s))
            .ok_or_else(|| ShimError::Bundle {
                what: "kill",
                detail: format!("signal {} is not a signal number", req.signal),
            })?;
        // SIGKILL ends the process tree (for init: the VM goes with it); any other signal is
        // delivered to the guest process (`all`: its process group).
        match (signal == libc::SIGKILL, req.exec_id.is_empty()) {
            (true, true) => c.kill_all().await,
            (true, false) => p.kill(),
            (false, _) => p.signal(signal, req.all)?,
        }
        Ok(())
    }

    async fn do_delete(&self, req: api::DeleteRequest) -> Result<api::DeleteResponse, ShimError> {
        let c = self.container(&req.id)?;
        let p = c.delete(&req.exec_id).await?;
        let exit = p.exit();
        if req.exec_id.is_empty() {
            self.containers.locked().remove(&req.id);
            let ev = TaskDelete {
                container_id: c.id.clone(),
                id: c.id.clone(),
                pid: c.pid,
                exit_status: exit.map(|e| e.code).unwrap_or(KILLED),
                exited_at: exit.map(|e| timestamp(e.at)).into(),
                ..Default::default()
            };
            self.publish(topics::TASK_DELETE_EVENT_TOPIC, Box::new(ev))
                .await;
        }
        Ok(api::DeleteResponse {
            pid: c.pid,
            exit_status: exit.map(|e| e.code).unwrap_or(KILLED),
            exited_at: exit.map(|e| timestamp(e.at)).into(),
            ..Default::default()
        })
    }

    async fn do_exec(&self, req: api::ExecProcessRequest) -> Result<(), ShimError> {
        let c = self.container(&req.id)?;
        let spec = req.spec.as_ref().ok_or_else(|| ShimError::Bundle {
            what: "exec",
            detail: "no process spec".into(),
        })?;
        let doc: serde_json::Value =
            serde_json::from_slice(&spec.value).map_err(|e| ShimError::Bundle {
                what: "exec process",
                detail: e.to_string(),
            })?;
        let spec = crate::bundle::process(&doc)?;
        let stdio = Stdio {
            stdin: req.stdin.clone(),
            stdout: req.stdout.clone(),
            stderr: req.stderr.clone(),
            terminal: req.terminal,
        };
        c.add_exec(&req.exec_id, stdio, spec)?;
        self.watch_exit(c.clone(), c.process(&req.exec_id)?);
        let ev = TaskExecAdded {
            container_id: c.id.clone(),
            exec_id: req.exec_id.clone(),
            ..Default::default()
        };
        self.publish(topics::TASK_EXEC_ADDED_EVENT_TOPIC, Box::new(ev))
            .await;
        Ok(())
    }
}

#[async_trait]
impl Task for TaskService {
    async fn create(
        &self,
        _ctx: &TtrpcContext,
        req: api::CreateTaskRequest,
    ) -> TtrpcResult<api::CreateTaskResponse> {
        Ok(self.do_create(req).await?)
    }

    async fn start(
        &self,
        _ctx: &TtrpcContext,
        req: api::StartRequest,
    ) -> TtrpcResult<api::StartResponse> {
        Ok(self.do_start(req).await?)
    }

    async fn state(
        &self,
        _ctx: &TtrpcContext,
        req: api::StateRequest,
    ) -> TtrpcResult<api::StateResponse> {
        Ok(self.do_state(req)?)
    }

    async fn wait(
        &self,
        _ctx: &TtrpcContext,
        req: api::WaitRequest,
    ) -> TtrpcResult<api::WaitResponse> {
        let c = self.container(&req.id)?;
        let p = c.process(&req.exec_id)?;
        let exit = p.wait().await;
        p.wait_reported().await;
        Ok(api::WaitResponse {
            exit_status: exit.code,
            exited_at: Some(timestamp(exit.at)).into(),
            ..Default::default()
        })
    }

    async fn pause(&self, _ctx: &TtrpcContext, req: api::PauseRequest) -> TtrpcResult<api::Empty> {
        let c = self.container(&req.id)?;
        if c.init.status() != Status::Running {
            return Err(ShimError::State(format!("container {:?} is not running", req.id)).into());
        }
        c.pause()?;
        let ev = TaskPaused {
            container_id: c.id.clone(),
            ..Default::default()
        };
        self.publish(topics::TASK_PAUSED_EVENT_TOPIC, Box::new(ev))
            .await;
        Ok(api::Empty::default())
    }

    async fn resume(
        &self,
        _ctx: &TtrpcContext,
        req: api::ResumeRequest,
    ) -> TtrpcResult<api::Empty> {
        let c = self.container(&req.id)?;
        c.resume()?;
        let ev = TaskResumed {
            container_id: c.id.clone(),
            ..Default::default()
        };
        self.publish(topics::TASK_RESUMED_EVENT_TOPIC, Box::new(ev))
            .await;
        Ok(api::Empty::default())
    }

    /// Usage as cgroup v1 metrics (what `ctr task metrics` and the CRI read): a VM's host
    /// processes' CPU time, resident memory (the guest RAM touched included) and process
    /// count; a pod's app container's cgroup in the guest (CPU time, charged memory, its
    /// processes).
    async fn stats(
        &self,
        _ctx: &TtrpcContext,
        req: api::StatsRequest,
    ) -> TtrpcResult<api::StatsResponse> {
        let c = self.container(&req.id)?;
        let metrics = crate::metrics::of(&c.usage().await?, c.memory_limit());
        let any = containerd_shim::util::convert_to_any(Box::new(metrics))
            .map_err(ShimError::sandbox("encoding the metrics"))?;
        Ok(api::StatsResponse {
            stats: Some(any).into(),
            ..Default::default()
        })
    }

    async fn kill(&self, _ctx: &TtrpcContext, req: api::KillRequest) -> TtrpcResult<api::Empty> {
        self.do_kill(req).await?;
        Ok(api::Empty::default())
    }

    async fn delete(
        &self,
        _ctx: &TtrpcContext,
        req: api::DeleteRequest,
    ) -> TtrpcResult<api::DeleteResponse> {
        Ok(self.do_delete(req).await?)
    }

    async fn pids(
        &self,
        _ctx: &TtrpcContext,
        req: api::PidsRequest,
    ) -> TtrpcResult<api::PidsResponse> {
        let c = self.container(&req.id)?;
        let processes = c
            .host_pids()
            .into_iter()
            .map(|pid| containerd_shim::protos::types::task::ProcessInfo {
                pid,
                ..Default::default()
            })
            .collect();
        Ok(api::PidsResponse {
            processes,
            ..Default::default()
        })
    }

    async fn exec(
        &self,
        _ctx: &TtrpcContext,
        req: api::ExecProcessRequest,
    ) -> TtrpcResult<api::Empty> {
        self.do_exec(req).await?;
        Ok(api::Empty::default())
    }

    async fn resize_pty(
        &self,
        _ctx: &TtrpcContext,
        req: api::ResizePtyRequest,
    ) -> TtrpcResult<api::Empty> {
        let c = self.container(&req.id)?;
        let rows = u16::try_from(req.height).unwrap_or(u16::MAX);
        let cols = u16::try_from(req.width).unwrap_or(u16::MAX);
        c.process(&req.exec_id)?.resize(rows, cols);
        Ok(api::Empty::default())
    }

    async fn close_io(
        &self,
        _ctx: &TtrpcContext,
        req: api::CloseIORequest,
    ) -> TtrpcResult<api::Empty> {
        let c = self.container(&req.id)?;
        if req.stdin {
            c.process(&req.exec_id)?.close_stdin();
        }
        Ok(api::Empty::default())
    }

    async fn connect(
        &self,
        _ctx: &TtrpcContext,
        req: api::ConnectRequest,
    ) -> TtrpcResult<api::ConnectResponse> {
        let task_pid = self.container(&req.id).map(|c| c.pid).unwrap_or(0);
        Ok(api::ConnectResponse {
            shim_pid: std::process::id(),
            task_pid,
            version: env!("CARGO_PKG_VERSION").to_string(),
            ..Default::default()
        })
    }

    async fn shutdown(
        &self,
        _ctx: &TtrpcContext,
        _req: api::ShutdownRequest,
    ) -> TtrpcResult<api::Empty> {
        if self.containers.locked().is_empty() {
            self.shim.exit.signal();
        }
        Ok(api::Empty::default())
    }
}
