//! `vm serve -p [IP:]HOSTPORT:GUESTPORT -- CMD`: a server in a VM, published on the host.

use vm_sandbox::{MicroVm, Options, PublishSpec, ServeSpec};

use crate::args::ServeArgs;
use crate::dryrun;
use crate::exit;
use crate::resolve;
use crate::stream::{self, Signals};

/// `vm serve`.
pub async fn run(a: ServeArgs) -> anyhow::Result<u8> {
    if a.cmd.workdir.is_some() {
        return Err(exit::usage(
            "-w does not apply to vm serve (the server runs in the guest root)",
        ));
    }
    let publish = PublishSpec::parse(&a.publish)?;
    let mut signals = Signals::install()?;
    let resolved = resolve::flags(&a.vm, &a.cmd).await?;
    resolve::require_command(&resolved.spec, &a.command)?;
    if a.dry.dry_run {
        let plan = dryrun::Plan {
            command: Some(&a.command),
            publish: Some(vec![publish.to_string()]),
            ..dryrun::Plan::new(&resolved, a.vm.driver.as_deref())
        };
        return dryrun::report(&plan, a.dry.json);
    }
    let resolve::Resolved {
        spec,
        trust,
        policy,
    } = resolved;
    let options = Options {
        trust,
        policy,
        driver: a.vm.driver.clone(),
        name: format!("serve-{}", std::process::id()),
        run_dir_parent: Some(crate::state::Runtime::from_env()?.ephemeral_parent()),
        ..Options::default()
    };
    let vm = tokio::select! {
        vm = MicroVm::boot(spec, options) => vm?,
        sig = signals.recv() => {
            tracing::info!("{sig} while booting");
            return Ok(exit::INTERRUPTED);
        }
    };
    let serving = match vm
        .serve(ServeSpec {
            argv: a.command.clone(),
            publish,
        })
        .await
    {
        Ok(s) => s,
        Err(e) => {
            vm.close().await;
            return Err(e.into());
        }
    };
    println!("{}", serving.addr());
    let shown = match a.command.is_empty() {
        true => vm.spec().default_command().join(" "),
        false => a.command.join(" "),
    };
    eprintln!(
        "vm: serving {} on {} ({} driver); Ctrl-C to stop",
        shown,
        serving.addr(),
        vm.driver()
    );
    let code = tokio::select! {
        sig = signals.recv() => {
            tracing::info!("{sig}: stopping the server");
            exit::INTERRUPTED
        }
        () = serving.done() => {
            let tail = serving.output();
            let tail = tail.lines().rev().take(5).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join(" | ");
            match serving.exit() {
                Some(status) => {
                    eprintln!("vm: the server exited ({status:?}): {tail}");
                    stream::status_code(&status)
                }
                None if vm.machine().wall_expired() => {
                    eprintln!("vm: the VM's wall lifetime expired");
                    exit::TIMEOUT
                }
                None => {
                    eprintln!("vm: the server stopped: {tail}");
                    exit::FAILED
                }
            }
        }
    };
    if let Err(e) = serving.stop().await {
        tracing::warn!("stopping the server: {e}");
    }
    vm.close().await;
    Ok(code)
}
