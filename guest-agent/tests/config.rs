//! Kernel command-line configuration round trips and validation.
use vm_agent_protocol::config::{ConfigError, RootDisk, ShareKind, ShareMount};
use vm_agent_protocol::{AgentConfig, DiskFs, DiskMount};

#[test]
fn round_trip() {
    let c = AgentConfig {
        hostname: "box-1".into(),
        pids_max: Some(128),
        mem_limit_mib: Some(256),
        disks: vec![
            DiskMount {
                id: "data0".into(),
                guest_path: "/mnt/data".into(),
                fs: DiskFs::Erofs,
            },
            DiskMount {
                id: "e".into(),
                guest_path: "/srv/e".into(),
                fs: DiskFs::Ext4,
            },
            DiskMount {
                id: "raw-1".into(),
                guest_path: "/dev/disk/raw".into(),
                fs: DiskFs::Raw,
            },
        ],
        shares: vec![
            ShareMount {
                tag: "fs0".into(),
                guest_path: "/models".into(),
                kind: ShareKind::Dir,
                dax: true,
            },
            ShareMount {
                tag: "fs1".into(),
                guest_path: "/m/small.bin".into(),
                kind: ShareKind::File,
                dax: false,
            },
        ],
        root: Some(RootDisk {
            id: "root".into(),
            fs: DiskFs::Erofs,
        }),
        port: 2048,
        log: "debug".into(),
    };
    let line = c.to_cmdline().unwrap();
    assert_eq!(
        line,
        "vm.hostname=box-1 vm.port=2048 vm.pids=128 vm.mem=256 vm.log=debug vm.root=root:erofs \
         vm.disk=data0:/mnt/data:erofs vm.disk=e:/srv/e:ext4 vm.disk=raw-1:/dev/disk/raw:raw \
         vm.share=fs0:/models:dir:dax vm.share=fs1:/m/small.bin:file"
    );
    let full = format!("console=ttyS0 reboot=k {line} vm.future=1 quiet");
    let (back, unknown) = AgentConfig::from_cmdline(&full).unwrap();
    assert_eq!(back, c);
    assert_eq!(unknown, ["vm.future=1"]);
    let (d, _) = AgentConfig::from_cmdline("console=ttyS0").unwrap();
    assert_eq!(d, AgentConfig::default());
    assert_eq!(d.port, vm_agent_protocol::AGENT_PORT);
}

#[test]
fn invalid_values_name_the_key() {
    for (line, key) in [
        ("vm.pids=lots", "pids"),
        ("vm.pids=0", "pids"),
        ("vm.mem=-1", "mem"),
        ("vm.port=x", "port"),
        ("vm.hostname=bad_name!", "hostname"),
        ("vm.disk=id:/p", "disk"),
        ("vm.disk=id:/p:zfs", "disk"),
        ("vm.share=fs0:/p", "share"),
        ("vm.share=fs0:/p:pipe", "share"),
        ("vm.share=fs0:/p:dir:rw", "share"),
        ("vm.share=fs0:/p:dir:dax:x", "share"),
        ("vm.share=fs0:../p:dir", "share"),
        (
            "vm.share=0123456789012345678901234567890123456:/p:dir",
            "share",
        ),
        ("vm.disk=id:relative:ext4", "disk"),
        ("vm.disk=id:/a/../b:ext4", "disk"),
        ("vm.disk=waytoolongserialnumber1:/p:ext4", "disk"),
        ("vm.log=loud", "log"),
        ("vm.root=root", "root"),
        ("vm.root=root:zfs", "root"),
        ("vm.root=root:raw", "root"),
    ] {
        match AgentConfig::from_cmdline(line) {
            Err(ConfigError::Invalid { key: k, .. }) => assert_eq!(k, key, "{line}"),
            other => panic!("{line}: expected invalid {key}, got {other:?}"),
        }
    }
    let bad = AgentConfig {
        hostname: "has space".into(),
        ..Default::default()
    };
    assert!(bad.to_cmdline().is_err());
}
