//! `openshell sandbox connect` as the CLI and a v0.0.111 gateway do it: the system OpenSSH client with `ProxyCommand=openshell ssh-proxy …`, whose
//! ForwardTcp makes the gateway require READY and send `RelayOpen{ssh, service_id}`, then
//! move bytes. Here a loopback listener plays ForwardTcp (one accepted connection is one
//! `ssh-proxy` call) and `busybox nc` plays `ssh-proxy`'s stdin/stdout bridge.
//!
//! Also: a terminal to run OpenSSH on (so its pty-req size and SIGWINCH are real), and a
//! russh attacher for what OpenSSH cannot do on demand (signal requests, stalling reads).

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openshell_sandbox::proto::v1::{SshRelayTarget, relay_open};
use russh::client;
use russh::{Channel, ChannelMsg};
use tokio::net::TcpListener;
use tonic::Status;

use super::exec::{AnyKey, ssh_connect};
use super::gateway::{RawRelay, State, bridge};

/// The subsystem `connect` always asks for.
pub const MAIN_SUBSYSTEM: &str = "openshell-main";

impl State {
    /// ForwardTcp for `ssh-proxy`: the sandbox must be READY, then the relay is opened with
    /// `service_id = "ssh-proxy:<sandbox id>"` and the same 15 s session wait as exec.
    pub async fn forward_tcp_ssh(&self) -> Result<RawRelay, Status> {
        if !self.is_ready() {
            return Err(Status::failed_precondition("sandbox is not ready"));
        }
        self.open_relay_as(
            uuid::Uuid::new_v4().to_string(),
            Some(relay_open::Target::Ssh(SshRelayTarget {})),
            format!("ssh-proxy:{}", self.sandbox_id),
            true,
        )
        .await
    }
}

/// The gateway end of `ssh-proxy`: every TCP connection accepted here is one ForwardTcp call
/// bridged to a fresh relay.
pub struct ProxyListener {
    pub port: u16,
    task: tokio::task::JoinHandle<()>,
    /// ForwardTcp errors, as `ssh-proxy` would print them.
    pub errors: Arc<Mutex<Vec<Status>>>,
}

impl ProxyListener {
    pub async fn start(st: Arc<State>) -> ProxyListener {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let errors = Arc::new(Mutex::new(Vec::new()));
        let errs = errors.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut tcp, _)) = l.accept().await {
                let (st, errs) = (st.clone(), errs.clone());
                tokio::spawn(async move {
                    match st.forward_tcp_ssh().await {
                        Ok(relay) => {
                            let mut duplex = bridge(relay);
                            let _ = tokio::io::copy_bidirectional(&mut tcp, &mut duplex).await;
                        }
                        Err(s) => errs.lock().unwrap().push(s),
                    }
                });
            }
        });
        ProxyListener { port, task, errors }
    }

    /// What stands in for `openshell ssh-proxy …`: a stdin/stdout bridge to ForwardTcp.
    pub fn proxy_command(&self) -> String {
        format!("busybox nc 127.0.0.1 {}", self.port)
    }

    /// `ssh` with the options `openshell sandbox connect` passes for a tty spec. `extra` goes
    /// first: OpenSSH keeps the first value it is given for an option.
    pub fn ssh(&self, extra: &[&str]) -> Command {
        let mut c = Command::new("ssh");
        for e in extra {
            c.arg(e);
        }
        for o in [
            format!("ProxyCommand={}", self.proxy_command()),
            "StrictHostKeyChecking=no".into(),
            "UserKnownHostsFile=/dev/null".into(),
            "GlobalKnownHostsFile=/dev/null".into(),
            "LogLevel=ERROR".into(),
            "ServerAliveInterval=15".into(),
            "ServerAliveCountMax=3".into(),
        ] {
            c.arg("-o").arg(o);
        }
        c.args([
            "-tt",
            "-o",
            "RequestTTY=force",
            "-o",
            "SetEnv=TERM=xterm-256color",
            "-s",
            "sandbox",
            MAIN_SUBSYSTEM,
        ]);
        c
    }
}

impl Drop for ProxyListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// OpenSSH (or anything) on a terminal of its own: the slave is its controlling tty, so a
/// resize of the master is a real SIGWINCH.
pub struct Terminal {
    master: std::fs::File,
    pub child: std::process::Child,
    out: Arc<Mutex<Vec<u8>>>,
}

fn winsize(cols: u16, rows: u16) -> nix::pty::Winsize {
    nix::pty::Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

impl Terminal {
    pub fn spawn(mut cmd: Command, cols: u16, rows: u16) -> Terminal {
        let pty = nix::pty::openpty(Some(&winsize(cols, rows)), None).unwrap();
        let slave: OwnedFd = pty.slave;
        cmd.stdin(Stdio::from(slave.try_clone().unwrap()))
            .stdout(Stdio::from(slave.try_clone().unwrap()))
            .stderr(Stdio::from(slave));
        // SAFETY: only async-signal-safe syscalls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("starting ssh");
        drop(cmd);
        let master = std::fs::File::from(pty.master);
        let out = Arc::new(Mutex::new(Vec::new()));
        let (mut rd, o) = (master.try_clone().unwrap(), out.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // EIO once the slave side is closed everywhere.
            while let Ok(n @ 1..) = rd.read(&mut buf) {
                o.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Terminal { master, child, out }
    }

    /// Type `b` (the terminal is in raw mode under ssh: `\r` is Enter).
    pub fn type_bytes(&self, b: &[u8]) {
        (&self.master).write_all(b).unwrap();
    }

    pub fn resize(&self, cols: u16, rows: u16) {
        let ws = winsize(cols, rows);
        // SAFETY: TIOCSWINSZ reads one winsize from a live value; the fd is our pty master.
        let rc = unsafe { libc::ioctl(self.master.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
        assert_eq!(rc, 0, "TIOCSWINSZ: {}", std::io::Error::last_os_error());
    }

    pub fn output(&self) -> String {
        String::from_utf8_lossy(&self.out.lock().unwrap()).into_owned()
    }

    /// Wait until the screen shows `needle`; returns everything shown.
    pub async fn wait_for(&self, needle: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let o = self.output();
            if o.contains(needle) {
                return o;
            }
            assert!(
                Instant::now() < deadline,
                "the terminal never showed {needle:?}; it shows:\n{o}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "ssh did not exit; the terminal shows:\n{}",
                self.output()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A russh attacher on `openshell-main` and what it has received.
pub struct Attacher {
    pub handle: client::Handle<AnyKey>,
    pub ch: Channel<client::Msg>,
    pub out: Vec<u8>,
    pub err: Vec<u8>,
    pub exit: Option<u32>,
    pub eof: bool,
    pub closed: bool,
}

impl Attacher {
    /// Attach through ForwardTcp: optional `pty-req` of `pty` (cols, rows), optional
    /// `env OPENSHELL_MAIN_READ_ONLY=1`, then the subsystem request.
    pub async fn attach(
        st: &State,
        pty: Option<(u32, u32)>,
        read_only: bool,
    ) -> Result<Attacher, Status> {
        let relay = st.forward_tcp_ssh().await?;
        let handle = ssh_connect(bridge(relay)).await?;
        let ch = handle
            .channel_open_session()
            .await
            .map_err(|e| Status::internal(format!("channel open: {e}")))?;
        if let Some((c, r)) = pty {
            ch.request_pty(false, "xterm-256color", c, r, 0, 0, &[])
                .await
                .map_err(|e| Status::internal(format!("pty-req: {e}")))?;
        }
        if read_only {
            ch.set_env(false, "OPENSHELL_MAIN_READ_ONLY", "1")
                .await
                .map_err(|e| Status::internal(format!("env: {e}")))?;
        }
        ch.request_subsystem(true, MAIN_SUBSYSTEM)
            .await
            .map_err(|e| Status::internal(format!("subsystem: {e}")))?;
        Ok(Attacher {
            handle,
            ch,
            out: Vec::new(),
            err: Vec::new(),
            exit: None,
            eof: false,
            closed: false,
        })
    }

    pub fn out(&self) -> String {
        String::from_utf8_lossy(&self.out).into_owned()
    }

    pub fn err(&self) -> String {
        String::from_utf8_lossy(&self.err).into_owned()
    }

    /// Read messages until `done` holds (or the channel closes); false on timeout.
    pub async fn read_until(&mut self, limit: Duration, done: impl Fn(&Attacher) -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        while !done(self) {
            if self.closed {
                return false;
            }
            let msg = match tokio::time::timeout_at(deadline, self.ch.wait()).await {
                Ok(m) => m,
                Err(_) => return false,
            };
            match msg {
                None | Some(ChannelMsg::Close) => self.closed = true,
                Some(ChannelMsg::Data { data }) => self.out.extend_from_slice(&data),
                Some(ChannelMsg::ExtendedData { data, ext: 1 }) => {
                    self.err.extend_from_slice(&data)
                }
                Some(ChannelMsg::Eof) => self.eof = true,
                Some(ChannelMsg::ExitStatus { exit_status }) => self.exit = Some(exit_status),
                Some(_) => {}
            }
        }
        true
    }

    pub async fn wait_out(&mut self, needle: &str, limit: Duration) {
        let n = needle.to_owned();
        if !self.read_until(limit, |a| a.out().contains(&n)).await {
            panic!(
                "attacher never got {needle:?}; stdout {:?}, stderr {:?}, closed {}",
                self.out(),
                self.err(),
                self.closed
            );
        }
    }

    /// Read until the channel closes.
    pub async fn wait_closed(&mut self, limit: Duration) {
        if !self.read_until(limit, |a| a.closed).await && !self.closed {
            panic!(
                "channel not closed within {limit:?}; stdout {:?}, stderr {:?}",
                self.out(),
                self.err()
            );
        }
    }

    pub async fn send(&self, b: &[u8]) {
        self.ch.data(b).await.unwrap();
    }
}
