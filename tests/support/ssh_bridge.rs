//! OpenSSH (`ssh`, `sftp`) against the supervisor, as `openshell` drives it: the system client
//! with a ProxyCommand whose stdin/stdout is one relay. Here a
//! loopback listener stands in for the gateway's ForwardTcp (each accepted connection is one
//! fresh SSH relay) and `busybox nc` for `openshell ssh-proxy`.

use std::process::Command;
use std::sync::Arc;

use openshell_sandbox::proto::v1::{SshRelayTarget, relay_open};
use tokio::net::TcpListener;

use super::gateway::{State, bridge};

pub struct SshBridge {
    pub port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl SshBridge {
    pub async fn start(st: Arc<State>) -> SshBridge {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            while let Ok((mut tcp, _)) = l.accept().await {
                let st = st.clone();
                tokio::spawn(async move {
                    match st
                        .open_relay(Some(relay_open::Target::Ssh(SshRelayTarget {})))
                        .await
                    {
                        Ok(relay) => {
                            let mut duplex = bridge(relay);
                            let _ = tokio::io::copy_bidirectional(&mut tcp, &mut duplex).await;
                        }
                        Err(s) => eprintln!("ssh bridge: relay refused: {s}"),
                    }
                });
            }
        });
        SshBridge { port, task }
    }

    /// `program` (`ssh`, `sftp`) with the CLI's base options and our ProxyCommand; the caller
    /// adds its own arguments and the destination `sandbox`.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.args(["-F", "/dev/null"])
            .args(["-o", "StrictHostKeyChecking=no"])
            .args(["-o", "UserKnownHostsFile=/dev/null"])
            .args(["-o", "GlobalKnownHostsFile=/dev/null"])
            .args(["-o", "LogLevel=ERROR"])
            .args(["-o", "BatchMode=yes"])
            .args(["-o", "User=sandbox"])
            .arg("-o")
            .arg(format!("ProxyCommand=busybox nc 127.0.0.1 {}", self.port));
        c
    }
}

impl Drop for SshBridge {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Whether the OpenSSH client tools and busybox (for the ProxyCommand) are installed.
pub fn have_openssh() -> bool {
    ["ssh", "sftp", "busybox"].iter().all(|p| {
        Command::new(p)
            .arg("-V")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok()
    })
}
