//! One module per subcommand group.

pub mod cp;
pub mod drivers;
pub mod exec;
pub mod images;
pub mod manage;
pub mod mcp;
pub mod pause;
pub mod run;
pub mod serve;
pub mod snapshot;
pub mod stats;
