//! What each tool does, through the API as the CLI's other commands go: a spec the host's
//! rules and the library accepted ([`Host::admit`]), `MicroVm::boot`, the [`Guest`]
//! operations, `NamedVm` for a kept sandbox. Every outcome is a result an agent reads: text,
//! and the same facts as structured content; a [`Fault`] is a tool error.

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::{Value, json};
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use vm_sandbox::agent::Command;
use vm_sandbox::{MicroVm, Options, Run};
use vm_spec::Spec;

use super::fault::Fault;
use super::host::{Admitted, Host};
use super::output::{self, Finished};
use super::session::{Info, KEPT_LABEL, Owned, Session, Target};
use super::tools::{CommandAsk, CreateParams, ExecParams, NameParams, RunCodeParams, RunParams};
use crate::cmd::manage;
use crate::cmd::run::{Started, start_detached};
use crate::parse;
use crate::state::named::StartRequest;

/// A successful result: `text` for the agent, `data` as structured content.
pub fn ok(text: String, data: Value) -> CallToolResult {
    let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
    r.structured_content = Some(data);
    r
}

/// The result of a tool body: its value, or its fault as a tool error.
pub fn reply(r: Result<CallToolResult, Fault>) -> CallToolResult {
    r.unwrap_or_else(Fault::into_result)
}

/// The tools' bodies for one session.
pub struct Calls {
    pub host: Arc<Host>,
    pub session: Arc<Session>,
}

impl Calls {
    pub fn new(host: Arc<Host>, session: Arc<Session>) -> Calls {
        Calls { host, session }
    }

    /// `run`.
    pub async fn run(&self, p: RunParams, ct: CancellationToken) -> CallToolResult {
        let run = command(&p.cmd, self.host.workdir(), None);
        reply(self.fresh(&p.vm, run, &ct).await)
    }

    /// `run_code`: the snippet is the interpreter's stdin.
    pub async fn run_code(&self, p: RunCodeParams, ct: CancellationToken) -> CallToolResult {
        let run = Run {
            command: Command::Argv(p.language.argv()),
            stdin: p.code.into_bytes(),
            cwd: self.host.workdir(),
            ..Default::default()
        };
        reply(self.fresh(&p.vm, run, &ct).await)
    }

    /// A fresh VM for one command, closed when it ends (also when the call is cancelled).
    async fn fresh(
        &self,
        ask: &super::tools::VmAsk,
        run: Run,
        ct: &CancellationToken,
    ) -> Result<CallToolResult, Fault> {
        let permit = self.host.vm_permit()?;
        let a = self
            .host
            .admit(ask, format!("mcp-{}", std::process::id()))
            .await?;
        let wall = a.wall;
        let (vm, _permit) = self.boot(a.spec, a.options, ct, permit).await?;
        let vm = Arc::new(vm);
        let id = self.session.run_started(vm.clone())?;
        let result = output::capture(&vm, run, self.host.max_output, ct).await;
        let expired = vm.machine().wall_expired();
        self.session.run_done(id);
        vm.close().await;
        match result {
            Err(Fault::Failed(_)) if expired => Err(Fault::failed(format!(
                "the VM's lifetime ({}) expired before the command ended",
                parse::fmt_duration(wall)
            ))),
            Ok(f) => Ok(finished(&f, json!({}))),
            Err(f) => Err(f),
        }
    }

    /// Boots in a task of its own, so that a cancelled call lets the boot finish and then
    /// closes what it booted (a boot dropped half way could leave its processes behind),
    /// holding the VM's `permit` until then; else the VM and its permit.
    async fn boot(
        &self,
        spec: Spec,
        options: Options,
        ct: &CancellationToken,
        permit: OwnedSemaphorePermit,
    ) -> Result<(MicroVm, OwnedSemaphorePermit), Fault> {
        let mut task = tokio::spawn(MicroVm::boot(spec, options));
        let booted = tokio::select! {
            r = &mut task => r,
            () = ct.cancelled() => {
                tokio::spawn(async move {
                    if let Ok(Ok(vm)) = task.await {
                        vm.close().await;
                    }
                    drop(permit);
                });
                return Err(cancelled());
            }
        };
        match booted {
            Ok(Ok(vm)) => {
                tracing::info!(driver = vm.driver(), containment = %vm.containment(), "mcp: VM booted");
                Ok((vm, permit))
            }
            Ok(Err(e)) => Err(Fault::from_error(&e, self.host.host_mounts())),
            Err(e) => Err(Fault::failed(format!("the boot task failed: {e}"))),
        }
    }

    /// `sandbox_create`.
    pub async fn create(&self, p: CreateParams, ct: CancellationToken) -> CallToolResult {
        reply(self.create_inner(p, &ct).await)
    }

    async fn create_inner(
        &self,
        p: CreateParams,
        ct: &CancellationToken,
    ) -> Result<CallToolResult, Fault> {
        let name = match p.name {
            Some(n) => parse::vm_name(&n).map_err(|e| Fault::refused("name", e))?,
            None if p.keep => {
                return Err(Fault::refused(
                    "keep",
                    "a sandbox that outlives the session needs a name",
                ));
            }
            None => self.session.fresh_name(),
        };
        self.session.check_free(&name)?;
        if p.keep {
            return self.create_kept(name, &p.vm, ct).await;
        }
        let permit = self.host.vm_permit()?;
        let a = self.host.admit(&p.vm, name.clone()).await?;
        let info = info(&a);
        let (vm, permit) = self.boot(a.spec, a.options, ct, permit).await?;
        let data = json!({
            "name": name,
            "driver": vm.driver(),
            "containment": vm.containment().to_string(),
            "memory_mib": info.memory_mib,
            "timeout_s": info.wall.as_secs(),
            "kept": false,
        });
        let text = format!(
            "sandbox {name} is running ({}, {}; {} MiB; lifetime {}); it is removed when this session ends",
            vm.driver(),
            vm.containment(),
            info.memory_mib,
            parse::fmt_duration(info.wall),
        );
        self.session
            .insert(name, Owned::new(vm, info, permit))
            .map(|()| ok(text, data))
    }

    /// A kept sandbox: a named VM held by a supervisor, as `vm run -d` starts one.
    async fn create_kept(
        &self,
        name: String,
        ask: &super::tools::VmAsk,
        ct: &CancellationToken,
    ) -> Result<CallToolResult, Fault> {
        let _permit = self.host.vm_permit()?;
        if self.session.kept_running() + self.host.vms_in_use() > self.host.max_vms() {
            return Err(Fault::busy(format!(
                "this server's VMs and kept sandboxes reach its {} (vm mcp --max-vms); remove a kept sandbox",
                self.host.max_vms()
            )));
        }
        let a = self.host.admit(ask, name.clone()).await?;
        let info = info(&a);
        let request = StartRequest {
            spec: a.spec,
            trust: a.options.trust,
            policy: a.options.policy,
            driver: a.options.driver,
            workdir: self.host.workdir(),
            from: None,
            dax_window_mib: a.options.dax_window_mib,
        };
        let interrupted = async {
            ct.cancelled().await;
            "the call's cancellation"
        };
        let labels = [(KEPT_LABEL, "kept")];
        match start_detached(&self.host.runtime, &name, &request, &labels, interrupted).await {
            Ok(Started::Running) => Ok(ok(
                format!(
                    "sandbox {name} is running ({} MiB; lifetime {}) and outlives this session: sandbox_remove (or `vm rm -f {name}`) removes it",
                    info.memory_mib,
                    parse::fmt_duration(info.wall)
                ),
                json!({
                    "name": name,
                    "memory_mib": info.memory_mib,
                    "timeout_s": info.wall.as_secs(),
                    "kept": true,
                }),
            )),
            Ok(Started::Interrupted) => Err(cancelled()),
            Err(e) => Err(Fault::from_error(e.as_ref(), self.host.host_mounts())),
        }
    }

    /// `sandbox_remove`.
    pub async fn remove(&self, p: NameParams) -> CallToolResult {
        reply(self.remove_inner(&p.name).await)
    }

    async fn remove_inner(&self, name: &str) -> Result<CallToolResult, Fault> {
        if let Some(o) = self.session.take(name) {
            o.vm.close().await;
            return Ok(ok(format!("sandbox {name} removed"), json!({"name": name})));
        }
        // A kept sandbox (running or not), never another named VM.
        self.session.kept(name)?;
        let rt = &self.host.runtime;
        let gone = async {
            manage::stop_one(rt, name, Duration::from_secs(10)).await?;
            rt.remove(name)?;
            anyhow::Ok(())
        };
        gone.await
            .map_err(|e| Fault::from_error(e.as_ref(), 0))
            .map(|()| ok(format!("sandbox {name} removed"), json!({"name": name})))
    }

    /// `sandbox_exec`.
    pub async fn exec(&self, p: ExecParams, ct: CancellationToken) -> CallToolResult {
        reply(self.exec_inner(p, &ct).await)
    }

    async fn exec_inner(
        &self,
        p: ExecParams,
        ct: &CancellationToken,
    ) -> Result<CallToolResult, Fault> {
        let timeout = p
            .timeout
            .as_ref()
            .map(|t| t.duration("timeout"))
            .transpose()?;
        let target = self.session.find(&p.name)?;
        let default_dir = match &target {
            Target::Owned(_) => self.host.workdir(),
            Target::Kept(n) => n.request().workdir.clone(),
        };
        let run = command(&p.cmd, default_dir, timeout);
        let f = output::capture(target.guest(), run, self.host.max_output, ct).await?;
        Ok(finished(&f, json!({"name": p.name})))
    }

    /// `sandbox_list`.
    pub fn list(&self) -> CallToolResult {
        let listed = self.session.list();
        let mut text = String::new();
        let mut items = Vec::new();
        for (name, l) in &listed {
            let lifetime = l.info.as_ref().map(|i| parse::fmt_duration(i.wall));
            text.push_str(&format!(
                "{name}: {}, {} MiB{}{}{}\n",
                l.state,
                l.memory_mib,
                lifetime
                    .as_ref()
                    .map(|w| format!(", lifetime {w}"))
                    .unwrap_or_default(),
                if l.kept { ", kept" } else { "" },
                match l.urls.as_slice() {
                    [] => String::new(),
                    urls => format!(", serving {}", urls.join(" ")),
                },
            ));
            items.push(json!({
                "name": name,
                "state": l.state,
                "kept": l.kept,
                "memory_mib": l.memory_mib,
                "image": l.info.as_ref().and_then(|i| i.image.clone()),
                "urls": l.urls,
            }));
        }
        if text.is_empty() {
            text = "no sandboxes (sandbox_create makes one)".into();
        }
        ok(text, json!({ "sandboxes": items }))
    }
}

/// The guest command a call asks for: a shell line with its directory, variables and stdin.
fn command(c: &CommandAsk, default_dir: Option<String>, timeout: Option<Duration>) -> Run {
    Run {
        command: Command::Shell(c.command.clone()),
        stdin: c.stdin.clone().unwrap_or_default().into_bytes(),
        cwd: c.workdir.clone().or(default_dir),
        timeout,
        env: c.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        ..Default::default()
    }
}

fn info(a: &Admitted) -> Info {
    Info {
        image: a.image.clone(),
        memory_mib: a.memory_mib,
        wall: a.wall,
    }
}

/// A finished command's result, `extra` merged into its structured content.
fn finished(f: &Finished, extra: Value) -> CallToolResult {
    let mut data = f.json();
    if let (Value::Object(d), Value::Object(e)) = (&mut data, extra) {
        d.extend(e);
    }
    ok(f.text(), data)
}

pub fn cancelled() -> Fault {
    Fault::Cancelled("the call was cancelled".into())
}
