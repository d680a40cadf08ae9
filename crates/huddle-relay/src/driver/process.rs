//! Agent processes tied to their turn and to the relay (plan 0013).
//!
//! Every process a driver starts for an agent goes through [`AgentProcess`]:
//!
//! - It leads a **process group** of its own, so whatever it starts (a script's
//!   `sleep`, a CLI's subprocesses) is in the group and ends with it.
//! - A **reaper** — one `/bin/sh` per relay process running [`REAPER_SCRIPT`], its
//!   input one end of a socket pair whose other end only the relay holds — kills every
//!   registered group with SIGKILL when that input reaches end of file, which the
//!   kernel produces when the relay's last descriptor closes, however the relay died.
//!   A child registers its group between fork and exec, so no group ever runs
//!   unregistered.
//! - On Linux the child also gets a **parent-death signal** (SIGKILL). It fires when
//!   the *thread* that forked the child exits, so every agent is forked by one
//!   dedicated thread that lives as long as the process (tokio may retire its own
//!   threads); it is not inherited by grandchildren, which is why the reaper is the
//!   guarantee and this only its second line.
//! - [`AgentProcess::stop`] ends the group while the relay lives: SIGTERM, SIGKILL
//!   after a grace, and a wait until no member runs. Dropping an `AgentProcess` that
//!   was not stopped kills its group at once.
//! - A **start deadline** ([`AgentProcess::spawn_by`]): the child itself, between
//!   fork and exec, compares `CLOCK_MONOTONIC` with the deadline and does not exec
//!   when it is past ([`started_too_late`]). The child is a process of its own, so a
//!   relay stopped (SIGSTOP) or starved anywhere between its last claim check and
//!   the fork cannot start the agent late: the check happens after the fork, in a
//!   process the relay's pause does not stop.
//!
//! Without process groups (not Unix) the direct child is killed on stop and on drop,
//! and nothing more is promised.

use std::io;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

/// How long [`AgentProcess::stop`] waits after SIGKILL for the group to vanish before
/// it gives up with a warning (a process stuck in the kernel).
#[cfg(unix)]
const KILL_WAIT: Duration = Duration::from_secs(1);

/// How often a stopping group is looked at.
#[cfg(unix)]
const POLL: Duration = Duration::from_millis(5);

/// The reaper: reads `+PGID` / `-PGID` lines; at end of input kills every group still
/// registered. It ignores the signals a terminal or a service manager sends, so only
/// the end of its input ends it; it never signals group 0 or 1.
pub const REAPER_SCRIPT: &str = r#"trap '' HUP INT QUIT TERM PIPE
g=' '
while IFS= read -r l; do
  case $l in
    +*) g="$g${l#+} " ;;
    -*) case $g in *" ${l#-} "*) g="${g%% ${l#-} *} ${g#* ${l#-} }" ;; esac ;;
  esac
done
for p in $g; do
  case $p in ''|*[!0-9]*|0|1) continue ;; esac
  kill -s KILL -- "-$p" 2>/dev/null
done"#;

/// A process started for an agent, leading its own process group.
#[derive(Debug)]
pub struct AgentProcess {
    child: Child,
    /// The group while it may still run; `None` once it is gone and unregistered.
    #[cfg(unix)]
    group: Option<imp::Group>,
}

/// A temporary file holding `bytes`, already unlinked, positioned at its start: an
/// agent's whole input, on the kernel's side before the agent is started, so that
/// nothing the agent reads waits for the relay once it runs (a relay paused after
/// the start cannot hand the agent its input late).
pub(crate) fn input_file(bytes: &[u8]) -> io::Result<std::fs::File> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut options = std::fs::OpenOptions::new();
    options.read(true).write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut tries = 0;
    let mut file = loop {
        let path = std::env::temp_dir().join(format!(
            "huddle-prompt-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        match options.open(&path) {
            Ok(file) => {
                let _ = std::fs::remove_file(&path);
                break file;
            }
            // Left by an earlier process with the same id: take the next name.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && tries < 100 => tries += 1,
            Err(e) => return Err(e),
        }
    };
    std::io::Write::write_all(&mut file, bytes)?;
    std::io::Seek::rewind(&mut file)?;
    Ok(file)
}

/// Why a spawn given a start deadline did not run its program: the deadline had
/// passed when the child was about to exec.
#[derive(Debug)]
struct StartedTooLate;

impl std::fmt::Display for StartedTooLate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("not started: its start deadline had passed")
    }
}

impl std::error::Error for StartedTooLate {}

/// Whether `e` (from [`AgentProcess::spawn_by`]) says the program was not started
/// because its start deadline had passed. Nothing of it ran.
pub fn started_too_late(e: &io::Error) -> bool {
    e.get_ref()
        .is_some_and(|inner| inner.is::<StartedTooLate>())
}

impl AgentProcess {
    /// Starts `cmd` as the leader of a new process group registered with the reaper.
    /// Fails (rather than run unguarded) when no reaper can be started.
    pub async fn spawn(cmd: Command) -> io::Result<AgentProcess> {
        Self::spawn_by(cmd, None).await
    }

    /// Like [`AgentProcess::spawn`], but the program is started only if that happens
    /// before `start_by`: the child checks the monotonic clock between fork and exec,
    /// its last step before the program runs, and exits without exec'ing when it is
    /// late. That is an error for which [`started_too_late`] is true. (Without
    /// process groups, not Unix, the check is made just before the spawn.)
    pub async fn spawn_by(cmd: Command, start_by: Option<Instant>) -> io::Result<AgentProcess> {
        #[cfg(unix)]
        {
            let child = imp::spawn(cmd, start_by).await?;
            let group = child.id().and_then(imp::Group::of);
            Ok(AgentProcess { child, group })
        }
        #[cfg(not(unix))]
        {
            if start_by.is_some_and(|by| Instant::now() >= by) {
                return Err(io::Error::new(io::ErrorKind::TimedOut, StartedTooLate));
            }
            let mut cmd = cmd;
            cmd.kill_on_drop(true);
            Ok(AgentProcess {
                child: cmd.spawn()?,
            })
        }
    }

    /// The leader: its standard streams, its `wait`, its id.
    pub fn child(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Ends the whole group and returns the leader's exit status: SIGTERM, then
    /// SIGKILL once `grace` is over, then waits until no member runs. Also right after
    /// the leader exited by itself: what it left behind must not outlive the turn.
    pub async fn stop(&mut self, grace: Duration) -> io::Result<ExitStatus> {
        // The group is let go of only once it is gone: if this future is dropped
        // half-way, `Drop` still kills it.
        #[cfg(unix)]
        if let Some(group) = &self.group {
            let status = group.end(&mut self.child, grace).await;
            self.group = None;
            return status;
        }
        #[cfg(not(unix))]
        {
            let _ = grace;
            let _ = self.child.start_kill();
        }
        self.child.wait().await
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        // Not stopped (a driver future dropped mid-turn, a relay abandoning turns at
        // the end of its shutdown grace): nothing of it may go on running.
        #[cfg(unix)]
        if let Some(group) = self.group.take() {
            group.kill_now();
        }
    }
}

#[cfg(unix)]
mod imp {
    use std::collections::BTreeSet;
    use std::io::{self, Read};
    use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
    use std::os::unix::net::UnixStream;
    use std::os::unix::process::CommandExt as _;
    use std::process::{ExitStatus, Stdio};
    use std::sync::{mpsc, OnceLock};
    use std::time::{Duration, Instant};

    use nix::errno::Errno;
    use nix::sys::signal::{killpg, Signal};
    use nix::sys::socket::{send, MsgFlags};
    use nix::sys::time::TimeSpec;
    use nix::time::{clock_gettime, ClockId};
    use nix::unistd::{getpid, getppid, Pid};
    use tokio::process::{Child, Command};
    use tokio::runtime::Handle;
    use tokio::sync::oneshot;
    use tracing::{debug, warn};

    use super::{StartedTooLate, KILL_WAIT, POLL, REAPER_SCRIPT};

    /// Writes to the reaper must never raise SIGPIPE: `huddle` restores its default
    /// action, which would end the relay if the reaper were gone. (Elsewhere a reaper
    /// dying between two health checks could; see plan 0013.)
    #[cfg(any(target_os = "linux", target_os = "android"))]
    const NO_SIGPIPE: MsgFlags = MsgFlags::MSG_NOSIGNAL;
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    const NO_SIGPIPE: MsgFlags = MsgFlags::empty();

    /// A process group started by [`spawn`], registered with the reaper.
    #[derive(Debug)]
    pub(super) struct Group(Pid);

    impl Group {
        pub(super) fn of(leader: u32) -> Option<Group> {
            let pid = i32::try_from(leader).ok().filter(|p| *p > 1)?;
            Some(Group(Pid::from_raw(pid)))
        }

        /// TERM, KILL after `grace`, reap the leader, wait until no member runs,
        /// unregister.
        pub(super) async fn end(
            &self,
            leader: &mut Child,
            grace: Duration,
        ) -> io::Result<ExitStatus> {
            let pgid = self.0;
            if group_runs(pgid) {
                let _ = killpg(pgid, Signal::SIGTERM);
                let deadline = Instant::now() + grace;
                while group_runs(pgid) && Instant::now() < deadline {
                    // Reap the leader as soon as it exits (elsewhere than on Linux a
                    // zombie still counts as a member).
                    let _ = leader.try_wait();
                    tokio::time::sleep(POLL).await;
                }
                if group_runs(pgid) {
                    debug!(
                        pgid = pgid.as_raw(),
                        "agent group outlived its grace; killing it"
                    );
                    let _ = killpg(pgid, Signal::SIGKILL);
                }
            }
            let status = leader.wait().await;
            let deadline = Instant::now() + KILL_WAIT;
            while group_runs(pgid) {
                if Instant::now() >= deadline {
                    warn!(
                        pgid = pgid.as_raw(),
                        "agent group still has members {KILL_WAIT:?} after SIGKILL"
                    );
                    break;
                }
                let _ = killpg(pgid, Signal::SIGKILL);
                tokio::time::sleep(POLL).await;
            }
            forget(pgid);
            status
        }

        /// SIGKILL to the group now, without waiting; unregisters it.
        pub(super) fn kill_now(self) {
            let _ = killpg(self.0, Signal::SIGKILL);
            forget(self.0);
        }
    }

    /// Whether any member of group `pgid` still runs. On Linux a zombie (exited, not
    /// yet reaped — orphans are not reaped by every PID 1) does not count: it runs
    /// nothing. Elsewhere every member the kernel still knows counts.
    fn group_runs(pgid: Pid) -> bool {
        if killpg(pgid, None) == Err(Errno::ESRCH) {
            return false;
        }
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            let Ok(dir) = std::fs::read_dir("/proc") else {
                return true;
            };
            for entry in dir.flatten() {
                let name = entry.file_name();
                let Some(pid) = name
                    .to_str()
                    .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
                else {
                    continue;
                };
                let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                    continue;
                };
                if let Some((state, pgrp)) = parse_stat(&stat) {
                    if pgrp == pgid.as_raw() && !matches!(state, 'Z' | 'X' | 'x') {
                        return true;
                    }
                }
            }
            false
        }
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        true
    }

    /// The state and process group of a `/proc/<pid>/stat` line. The command name in
    /// parentheses may itself hold spaces and parentheses, so parse after the last `)`.
    pub(super) fn parse_stat(stat: &str) -> Option<(char, i32)> {
        let rest = &stat[stat.rfind(')')? + 1..];
        let mut fields = rest.split_whitespace();
        let state = fields.next()?.chars().next()?;
        let _ppid = fields.next()?;
        let pgrp = fields.next()?.parse().ok()?;
        Some((state, pgrp))
    }

    /// `+PID\n` or `-PID\n` into `buf`, without allocating (it runs between fork and
    /// exec, where only async-signal-safe calls are allowed).
    pub(super) fn line(op: u8, pid: i32, buf: &mut [u8; 16]) -> &[u8] {
        let mut digits = [0u8; 11];
        let mut n = pid.unsigned_abs();
        let mut len = 0;
        loop {
            digits[len] = b'0' + (n % 10) as u8;
            len += 1;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        buf[0] = op;
        for i in 0..len {
            buf[1 + i] = digits[len - 1 - i];
        }
        buf[1 + len] = b'\n';
        &buf[..len + 2]
    }

    enum Request {
        Spawn {
            cmd: Box<Command>,
            start_by: Option<Instant>,
            runtime: Handle,
            reply: oneshot::Sender<io::Result<Child>>,
        },
        Forget(Pid),
    }

    /// The errno the child reports when it is past its start deadline.
    const LATE: Errno = Errno::ETIMEDOUT;

    /// `at` on the `CLOCK_MONOTONIC` scale the child reads (`Instant` is that clock on
    /// Unix, but its value is opaque): now on that clock plus the time until `at`.
    fn monotonic(at: Instant) -> io::Result<TimeSpec> {
        let now = Instant::now();
        let base = clock_gettime(ClockId::CLOCK_MONOTONIC)?;
        let ahead = |d: Duration| TimeSpec::from_duration(d);
        Ok(if at >= now {
            base + ahead(at - now)
        } else {
            base - ahead(now - at)
        })
    }

    /// The spawner thread's queue, started on first use; the thread lives as long as
    /// the process (its exit would fire the children's parent-death signal).
    fn spawner() -> &'static mpsc::Sender<Request> {
        static QUEUE: OnceLock<mpsc::Sender<Request>> = OnceLock::new();
        QUEUE.get_or_init(|| {
            let (tx, rx) = mpsc::channel();
            let started = std::thread::Builder::new()
                .name("huddle-spawner".into())
                .spawn(move || Spawner::default().run(rx));
            if let Err(e) = started {
                // The receiver is gone with the closure: every spawn reports it.
                warn!(error = %e, "cannot start the agent spawner thread");
            }
            tx
        })
    }

    pub(super) async fn spawn(mut cmd: Command, start_by: Option<Instant>) -> io::Result<Child> {
        cmd.kill_on_drop(true);
        let (reply, answer) = oneshot::channel();
        spawner()
            .send(Request::Spawn {
                cmd: Box::new(cmd),
                start_by,
                runtime: Handle::current(),
                reply,
            })
            .map_err(|_| io::Error::other("the agent spawner thread is not running"))?;
        answer
            .await
            .map_err(|_| io::Error::other("the agent spawner thread stopped"))?
    }

    fn forget(pgid: Pid) {
        let _ = spawner().send(Request::Forget(pgid));
    }

    struct Reaper {
        process: std::process::Child,
        socket: UnixStream,
    }

    #[derive(Default)]
    pub(super) struct Spawner {
        reaper: Option<Reaper>,
        /// Groups registered and not yet gone: told again to a new reaper.
        live: BTreeSet<i32>,
    }

    impl Spawner {
        fn run(mut self, queue: mpsc::Receiver<Request>) {
            loop {
                match queue.recv_timeout(Duration::from_secs(1)) {
                    Ok(Request::Spawn {
                        cmd,
                        start_by,
                        runtime,
                        reply,
                    }) => {
                        let _ = reply.send(self.spawn(*cmd, start_by, &runtime));
                    }
                    Ok(Request::Forget(pgid)) => {
                        self.live.remove(&pgid.as_raw());
                        self.tell(b'-', pgid.as_raw());
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        if !self.live.is_empty() {
                            if let Err(e) = self.ensure_reaper() {
                                warn!(error = %e, "no process reaper: agents would outlive a crashed relay");
                            }
                        }
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                }
            }
        }

        /// The running reaper, started (again) when there is none; a new one is told
        /// every live group.
        pub(super) fn ensure_reaper(&mut self) -> io::Result<RawFd> {
            if let Some(r) = &mut self.reaper {
                match r.process.try_wait() {
                    Ok(None) => return Ok(r.socket.as_raw_fd()),
                    Ok(Some(status)) => {
                        warn!(%status, "the process reaper exited; starting a new one")
                    }
                    Err(e) => warn!(error = %e, "the process reaper cannot be checked"),
                }
                self.drop_reaper();
            }
            let (ours, theirs) = UnixStream::pair()?;
            let process = std::process::Command::new("/bin/sh")
                .args(["-c", REAPER_SCRIPT, "huddle-reaper"])
                .stdin(Stdio::from(OwnedFd::from(theirs)))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .current_dir("/")
                .process_group(0)
                .spawn()
                .map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("cannot start the process reaper (/bin/sh): {e}"),
                    )
                })?;
            debug!(pid = process.id(), "process reaper started");
            let fd = ours.as_raw_fd();
            self.reaper = Some(Reaper {
                process,
                socket: ours,
            });
            for pgid in self.live.clone() {
                self.tell(b'+', pgid);
            }
            Ok(fd)
        }

        fn drop_reaper(&mut self) {
            if let Some(mut r) = self.reaper.take() {
                let _ = r.process.kill();
                let _ = r.process.wait();
            }
        }

        /// One line to the reaper; a reaper that cannot take it is replaced at the
        /// next check.
        fn tell(&mut self, op: u8, pgid: i32) {
            let Some(r) = &self.reaper else { return };
            let mut buf = [0u8; 16];
            let l = line(op, pgid, &mut buf);
            if send(r.socket.as_raw_fd(), l, NO_SIGPIPE) != Ok(l.len()) {
                warn!("the process reaper does not read; replacing it");
                self.drop_reaper();
                if let Err(e) = self.ensure_reaper() {
                    warn!(error = %e, "no process reaper: agents would outlive a crashed relay");
                }
            }
        }

        pub(super) fn spawn(
            &mut self,
            mut cmd: Command,
            start_by: Option<Instant>,
            runtime: &Handle,
        ) -> io::Result<Child> {
            let reaper = self.ensure_reaper()?;
            // The child reports the pid it registered, so that a spawn whose exec
            // fails is unregistered again.
            let (report_rx, report_tx) = UnixStream::pair()?;
            let report = report_tx.as_raw_fd();
            let parent = getpid();
            let deadline = start_by.map(monotonic).transpose()?;
            cmd.process_group(0);
            // SAFETY: the hook runs between fork and exec and only makes
            // async-signal-safe calls (prctl, getppid, getpid, send, write,
            // clock_gettime) on descriptors that stay open in this thread until
            // `spawn` returns.
            unsafe {
                cmd.pre_exec(move || enter_group(parent, reaper, report, deadline));
            }
            let spawned = {
                let _runtime = runtime.enter();
                cmd.spawn()
            };
            drop(cmd);
            drop(report_tx);
            let registered = read_pid(report_rx);
            match spawned {
                Ok(child) => {
                    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
                        if registered != Some(pid) {
                            // Not expected: the hook registers before exec. Be sure.
                            self.tell(b'+', pid);
                        }
                        self.live.insert(pid);
                    }
                    Ok(child)
                }
                Err(e) => {
                    if let Some(pid) = registered {
                        self.tell(b'-', pid);
                    }
                    // The child's own verdict, confirmed here on the same clock.
                    let late = e.raw_os_error() == Some(LATE as i32)
                        && start_by.is_some_and(|by| Instant::now() >= by);
                    if late {
                        return Err(io::Error::new(io::ErrorKind::TimedOut, StartedTooLate));
                    }
                    Err(e)
                }
            }
        }
    }

    /// The pid the child reported, if it got that far.
    fn read_pid(mut from: UnixStream) -> Option<i32> {
        let _ = from.set_read_timeout(Some(Duration::from_secs(1)));
        let mut buf = [0u8; 4];
        from.read_exact(&mut buf).ok()?;
        Some(i32::from_ne_bytes(buf))
    }

    /// In the child, between fork and exec: parent-death signal, a check that the
    /// relay did not die during the fork, registration with the reaper, and last the
    /// start deadline: past it, the child exits without exec'ing (reported as
    /// [`LATE`]), so the program never runs.
    fn enter_group(
        parent: Pid,
        reaper: RawFd,
        report: RawFd,
        deadline: Option<TimeSpec>,
    ) -> io::Result<()> {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
        if getppid() != parent {
            return Err(Errno::ESRCH.into());
        }
        let pid = getpid().as_raw();
        // SAFETY: `report` is open in the forking thread until `spawn` returns.
        let report = unsafe { BorrowedFd::borrow_raw(report) };
        nix::unistd::write(report, &pid.to_ne_bytes())?;
        let mut buf = [0u8; 16];
        let l = line(b'+', pid, &mut buf);
        if send(reaper, l, NO_SIGPIPE)? != l.len() {
            return Err(Errno::EIO.into());
        }
        if let Some(deadline) = deadline {
            if clock_gettime(ClockId::CLOCK_MONOTONIC)? >= deadline {
                return Err(LATE.into());
            }
        }
        Ok(())
    }

    #[cfg(test)]
    impl Spawner {
        /// Kills the reaper behind the spawner's back, as a stray `kill -9` would.
        pub(super) fn kill_reaper(&mut self) {
            let r = self.reaper.as_mut().expect("a reaper");
            r.process.kill().expect("kill the reaper");
            while r.process.try_wait().expect("try_wait").is_none() {
                std::thread::sleep(Duration::from_millis(1));
            }
        }

        /// Closes the spawner's end of the reaper's input, as the relay's death would,
        /// and hands back the reaper process.
        pub(super) fn close_reaper(&mut self) -> std::process::Child {
            self.reaper.take().expect("a reaper").process
        }
    }

    #[cfg(test)]
    pub(super) fn reaper_for_test() -> io::Result<(std::process::Child, UnixStream)> {
        let (ours, theirs) = UnixStream::pair()?;
        let process = std::process::Command::new("/bin/sh")
            .args(["-c", REAPER_SCRIPT, "huddle-reaper"])
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .process_group(0)
            .spawn()?;
        Ok((process, ours))
    }

    #[cfg(test)]
    pub(super) fn runs(pgid: u32) -> bool {
        group_runs(Pid::from_raw(pgid as i32))
    }
}

#[cfg(all(test, target_os = "linux"))]
pub(crate) mod tests {
    use std::io::Write;
    use std::os::unix::process::CommandExt as _;
    use std::process::Stdio;
    use std::time::Instant;

    use super::*;

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", script])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        c
    }

    /// Reads `leader grandchild` pids the script prints first.
    async fn pids(p: &mut AgentProcess) -> (u32, u32) {
        use tokio::io::AsyncBufReadExt;
        let out = p.child().stdout.take().expect("stdout");
        let mut lines = tokio::io::BufReader::new(out).lines();
        let line = lines.next_line().await.expect("read").expect("a line");
        let mut it = line
            .split_whitespace()
            .map(|n| n.parse::<u32>().expect("pid"));
        (it.next().expect("leader"), it.next().expect("grandchild"))
    }

    /// Whether process `pid` runs (a zombie runs nothing).
    pub(crate) fn alive(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| imp::parse_stat(&s))
            .is_some_and(|(state, _)| state != 'Z')
    }

    /// A group whose leader waits for a background `sleep`: the process, the
    /// leader's pid and the grandchild's.
    async fn sleeping_group() -> (AgentProcess, u32, u32) {
        let mut p = AgentProcess::spawn(sh("sleep 30 & echo $$ $!; wait"))
            .await
            .expect("spawn");
        let (leader, grandchild) = pids(&mut p).await;
        (p, leader, grandchild)
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    /// Waits (bounded) until neither the group nor the grandchild runs.
    async fn wait_gone(leader: u32, grandchild: u32) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while (imp::runs(leader) || alive(grandchild)) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(
            !imp::runs(leader) && !alive(grandchild),
            "group {leader} or its grandchild {grandchild} still runs"
        );
    }

    #[test]
    fn lines_and_stat_parse() {
        let mut buf = [0u8; 16];
        assert_eq!(imp::line(b'+', 42, &mut buf), b"+42\n");
        assert_eq!(imp::line(b'-', 0, &mut buf), b"-0\n");
        assert_eq!(
            imp::line(b'+', i32::MAX, &mut buf),
            format!("+{}\n", i32::MAX).as_bytes()
        );
        assert_eq!(
            imp::parse_stat("123 (a) b (c)) S 1 456 456 0 -1"),
            Some(('S', 456))
        );
        assert_eq!(imp::parse_stat("123 (x) Z 1 77 77"), Some(('Z', 77)));
        assert_eq!(imp::parse_stat("garbage"), None);
    }

    #[tokio::test]
    async fn stop_ends_the_group_with_its_grandchildren() {
        let (mut p, leader, grandchild) = sleeping_group().await;
        assert!(alive(leader) && alive(grandchild));
        let started = Instant::now();
        let status = p.stop(Duration::from_secs(5)).await.expect("stop");
        assert!(!status.success());
        // SIGTERM was enough: well inside the grace.
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert!(!alive(leader) && !alive(grandchild));
        assert!(!imp::runs(leader));
    }

    #[tokio::test]
    async fn a_group_that_ignores_term_is_killed_after_the_grace() {
        let mut p = AgentProcess::spawn(sh(
            "trap '' TERM; sh -c 'trap \"\" TERM; sleep 30' & echo $$ $!; wait",
        ))
        .await
        .expect("spawn");
        let (leader, grandchild) = pids(&mut p).await;
        let started = Instant::now();
        p.stop(Duration::from_millis(300)).await.expect("stop");
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(300), "{took:?}");
        assert!(took < Duration::from_secs(3), "{took:?}");
        assert!(!alive(leader) && !alive(grandchild));
    }

    #[tokio::test]
    async fn stragglers_of_a_finished_leader_are_ended() {
        // The background child keeps no pipe of ours: the leader exits at once.
        let mut p = AgentProcess::spawn(sh("sleep 30 >/dev/null 2>&1 & echo $$ $!"))
            .await
            .expect("spawn");
        let (_, grandchild) = pids(&mut p).await;
        let status = p.child().wait().await.expect("wait");
        assert!(status.success());
        assert!(alive(grandchild), "the straggler runs until the turn ends");
        p.stop(Duration::from_secs(5)).await.expect("stop");
        assert!(!alive(grandchild));
    }

    #[tokio::test]
    async fn dropping_kills_the_group() {
        let (p, leader, grandchild) = sleeping_group().await;
        drop(p);
        wait_gone(leader, grandchild).await;
    }

    #[tokio::test]
    async fn a_stop_dropped_half_way_still_ends_the_group() {
        let mut p = AgentProcess::spawn(sh(
            "trap '' TERM; sh -c 'trap \"\" TERM; sleep 30' & echo $$ $!; wait",
        ))
        .await
        .expect("spawn");
        let (leader, grandchild) = pids(&mut p).await;
        let stopping = tokio::time::timeout(Duration::from_millis(100), p.stop(secs(30))).await;
        assert!(
            stopping.is_err(),
            "TERM is ignored: the stop is still in its grace"
        );
        assert!(alive(leader) && alive(grandchild));
        drop(p);
        wait_gone(leader, grandchild).await;
    }

    #[tokio::test]
    async fn a_failed_exec_is_an_error() {
        let err = AgentProcess::spawn(Command::new("/nonexistent/agent"))
            .await
            .expect_err("no such program");
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        // The spawner goes on working.
        let mut p = AgentProcess::spawn(sh("echo $$ $$")).await.expect("spawn");
        let (leader, _) = pids(&mut p).await;
        assert!(p.child().wait().await.expect("wait").success());
        assert!(p
            .stop(Duration::from_secs(1))
            .await
            .expect("stop")
            .success());
        assert!(!imp::runs(leader));
    }

    /// A program that records every real start in `file`.
    fn recording(file: &std::path::Path) -> Command {
        sh(&format!("echo started >> {}", file.display()))
    }

    fn starts(file: &std::path::Path) -> usize {
        std::fs::read_to_string(file)
            .map(|t| t.lines().count())
            .unwrap_or(0)
    }

    #[tokio::test]
    async fn a_spawn_past_its_start_deadline_never_execs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("starts");
        // Already past: the child sees it between fork and exec and does not exec.
        let past = Instant::now() - Duration::from_millis(1);
        let err = AgentProcess::spawn_by(recording(&file), Some(past))
            .await
            .expect_err("a late start is refused");
        assert!(started_too_late(&err), "{err:?}");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        // Now: the deadline passes while the spawn is on its way to the fork.
        let err = AgentProcess::spawn_by(recording(&file), Some(Instant::now()))
            .await
            .expect_err("a start at its deadline is late");
        assert!(started_too_late(&err), "{err:?}");
        // In time: it runs, exactly once.
        let soon = Instant::now() + Duration::from_secs(30);
        let mut p = AgentProcess::spawn_by(recording(&file), Some(soon))
            .await
            .expect("in time");
        assert!(p.child().wait().await.expect("wait").success());
        p.stop(Duration::from_secs(1)).await.expect("stop");
        assert_eq!(starts(&file), 1, "only the spawn in time ran");
        // Other failures are not mistaken for lateness.
        let err = AgentProcess::spawn_by(Command::new("/nonexistent/agent"), Some(soon))
            .await
            .expect_err("no such program");
        assert!(!started_too_late(&err), "{err:?}");
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }

    #[tokio::test]
    async fn the_deadline_is_checked_in_the_child_after_the_fork() {
        // The spawn is asked for well before its deadline, but the child is held up
        // after the fork (as a starved machine might) until the deadline has passed:
        // the child's own check, its last step before exec, refuses to start.
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("starts");
        let mut cmd = recording(&file);
        // SAFETY: nanosleep is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                std::thread::sleep(Duration::from_millis(150));
                Ok(())
            });
        }
        let by = Instant::now() + Duration::from_millis(50);
        let err = AgentProcess::spawn_by(cmd, Some(by))
            .await
            .expect_err("late after the fork");
        assert!(started_too_late(&err), "{err:?}");
        assert_eq!(starts(&file), 0);
    }

    #[tokio::test]
    async fn a_replaced_reaper_is_told_every_live_group() {
        let mut spawner = imp::Spawner::default();
        let child = spawner
            .spawn(
                sh("sleep 30 & echo $$ $!; wait"),
                None,
                &tokio::runtime::Handle::current(),
            )
            .expect("spawn");
        let mut p = AgentProcess { child, group: None };
        let (leader, grandchild) = pids(&mut p).await;
        spawner.kill_reaper();
        spawner.ensure_reaper().expect("a new reaper");
        let mut reaper = spawner.close_reaper();
        assert!(reaper.wait().expect("the reaper exits").success());
        // Only the new reaper can have killed the group: it was told about it.
        wait_gone(leader, grandchild).await;
    }

    #[test]
    fn the_reaper_kills_registered_groups_when_its_input_closes() {
        let group = |script: &str| {
            std::process::Command::new("sh")
                .args(["-c", script])
                .process_group(0)
                .stdout(Stdio::null())
                .spawn()
                .expect("spawn a group")
        };
        let mut doomed = group("sleep 30 & sleep 30");
        let mut spared = group("sleep 30 & sleep 30");
        let mut forgotten = group("sleep 30 & sleep 30");
        let (mut reaper, mut input) = imp::reaper_for_test().expect("reaper");
        writeln!(input, "+{}", doomed.id()).expect("write");
        writeln!(input, "+{}", forgotten.id()).expect("write");
        writeln!(input, "-{}", forgotten.id()).expect("write");
        writeln!(input, "+junk").expect("write");
        let closed = Instant::now();
        drop(input);
        assert!(reaper.wait().expect("reaper exits").success());
        let status = doomed.wait().expect("wait");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        while imp::runs(doomed.id()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            !imp::runs(doomed.id()),
            "the doomed group's grandchild survived"
        );
        eprintln!(
            "reaper: group gone {:?} after its input closed",
            closed.elapsed()
        );
        for c in [&mut spared, &mut forgotten] {
            assert!(c.try_wait().expect("try_wait").is_none());
            assert!(imp::runs(c.id()));
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = c.wait();
        }
    }
}
