//! `vm pause` and `vm unpause`: the VM's holder (a `vm run -d` supervisor, or a `vm serve`
//! once its server is ready) stops (or continues) every host process of the VM, as
//! `docker pause` freezes a container's cgroup; the record says `paused` while it is. A paused
//! VM refuses `vm exec`/`vm cp` and its published ports drop new connections until unpaused;
//! `vm stop` works either way.

use crate::exit;
use crate::output::{errln, outln};
use crate::state::{Runtime, named};

/// `vm pause NAME…` (`pause`) or `vm unpause NAME…`.
pub async fn run(names: &[String], pause: bool) -> anyhow::Result<u8> {
    let rt = Runtime::from_env()?;
    let mut code = exit::OK;
    let verb = if pause { "pause" } else { "unpause" };
    for name in names {
        match named::set_paused(&rt, name, pause)
            .await
            .map_err(anyhow::Error::from)
        {
            Ok(()) => outln!("{name}"),
            Err(e) => {
                errln!("vm: {verb} {name}: {}", exit::one_line(&e));
                code = exit::classify(&e);
            }
        }
    }
    Ok(code)
}
