//! Judging one mutant: does the library still load, do the script tests still pass, does a
//! short soak still pass. Each step runs a binary built once with the feature `lua-dir`, with
//! `REDSEM_LUA_DIR` naming a directory that holds the mutated file.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use redsem_test::RedisServer;

use super::catalogue::Mutant;

/// What became of a mutant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A test failed or the soak reported a violation: `by` names which.
    Killed {
        by: String,
    },
    Survived,
    /// A run did not end in time (`what` ran).
    Timeout {
        what: String,
    },
    /// The mutated library does not compile (`FUNCTION LOAD` refused it).
    Unviable {
        error: String,
    },
}

impl Outcome {
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Killed { .. } => "killed",
            Outcome::Survived => "survived",
            Outcome::Timeout { .. } => "timeout",
            Outcome::Unviable { .. } => "unviable",
        }
    }

    pub fn detail(&self) -> &str {
        match self {
            Outcome::Killed { by } => by,
            Outcome::Survived => "",
            Outcome::Timeout { what } => what,
            Outcome::Unviable { error } => error,
        }
    }
}

/// How mutants are judged.
#[derive(Debug, Clone)]
pub struct Judge {
    pub test_binary: PathBuf,
    pub soak_binary: PathBuf,
    pub test_threads: usize,
    pub test_timeout: Duration,
    pub soak_seeds: Vec<u64>,
    pub soak_duration: Duration,
}

/// A child process's stdout, line by line, until it ends or `deadline`; `stop` says whether
/// a line settles the run (the child is then killed). Returns the line that stopped it,
/// `Err(())` at the deadline (the child killed), or `Ok(None)` with the exit status.
fn watch(
    mut child: Child,
    deadline: Instant,
    stop: impl Fn(&str) -> Option<String>,
) -> Result<(Option<String>, bool), ()> {
    let stdout = child.stdout.take();
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        if let Some(out) = stdout {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        }
    });
    let mut found = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                if let Some(what) = stop(&line) {
                    found = Some(what);
                    break;
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                let _ = reader.join();
                return Err(());
            }
        }
    }
    if found.is_some() {
        let _ = child.kill();
    }
    let ok = child.wait().is_ok_and(|s| s.success());
    let _ = reader.join();
    Ok((found, ok))
}

/// Start `cmd` with the mutated scripts of `dir`, its stdout piped (if it cannot start, the
/// runner's own failure as the outcome: a kill that names it).
fn spawn(mut cmd: Command, dir: &Path) -> Result<Child, Outcome> {
    cmd.env("REDSEM_LUA_DIR", dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| Outcome::Killed {
            by: format!(
                "(runner: cannot start {}: {e})",
                cmd.get_program().to_string_lossy()
            ),
        })
}

impl Judge {
    /// The test filters for a mutant of `file`: its primitive's script tests and the
    /// library's (a mutant of `common` may break any of them).
    fn filters(file: &str) -> Vec<&'static str> {
        if file.starts_with("lease/") {
            vec!["script::lease::", "script::library::"]
        } else if file.starts_with("permit/") {
            vec!["script::permit::", "script::library::"]
        } else if file.starts_with("latch/") {
            vec!["script::latch::", "script::library::"]
        } else {
            vec!["script::"]
        }
    }

    /// Judge `mutant` against `checker` (a server where its library is loaded first).
    pub fn judge(&self, mutant: &Mutant, checker: &RedisServer) -> Outcome {
        let dir = match tempfile::tempdir() {
            Ok(dir) => dir,
            Err(e) => {
                return Outcome::Killed {
                    by: format!("(runner: no temp dir: {e})"),
                };
            }
        };
        let path = dir.path().join(format!("{}.lua", mutant.file));
        if let Err(e) = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&path, &mutant.text))
        {
            return Outcome::Killed {
                by: format!("(runner: cannot write the mutant: {e})"),
            };
        }
        if let Err(error) = load(dir.path(), checker) {
            return if error.contains("compiling") || error.contains("syntax") {
                Outcome::Unviable { error }
            } else {
                Outcome::Killed {
                    by: format!("FUNCTION LOAD: {error}"),
                }
            };
        }
        let outcome = self.tests(&mutant.file, dir.path());
        if outcome != Outcome::Survived {
            return outcome;
        }
        self.soak(dir.path())
    }

    /// The script tests with the mutated file in `dir`. A test that fails is run again alone
    /// to confirm it: if it passes then (a test that failed under load, not by the mutant),
    /// the whole run is made once more and its outcome is the answer.
    pub fn tests(&self, file: &str, dir: &Path) -> Outcome {
        let outcome = self.run_tests(Self::filters(file), false, dir);
        let Outcome::Killed { by } = &outcome else {
            return outcome;
        };
        if !by.starts_with("script::") {
            return outcome;
        }
        match self.run_tests(vec![by.as_str()], true, dir) {
            Outcome::Survived => self.run_tests(Self::filters(file), false, dir),
            _ => outcome,
        }
    }

    fn run_tests(&self, filters: Vec<&str>, exact: bool, dir: &Path) -> Outcome {
        let mut cmd = Command::new(&self.test_binary);
        cmd.args(filters)
            .arg("--test-threads")
            .arg(self.test_threads.to_string());
        if exact {
            cmd.arg("--exact");
        }
        let child = match spawn(cmd, dir) {
            Ok(child) => child,
            Err(outcome) => return outcome,
        };
        let failed = |line: &str| {
            let name = line.strip_prefix("test ")?.strip_suffix(" ... FAILED")?;
            Some(name.to_owned())
        };
        match watch(child, Instant::now() + self.test_timeout, failed) {
            Err(()) => Outcome::Timeout {
                what: "script tests".into(),
            },
            Ok((Some(test), _)) => Outcome::Killed { by: test },
            Ok((None, true)) => Outcome::Survived,
            Ok((None, false)) => Outcome::Killed {
                by: "the test binary (failed without a failing test)".into(),
            },
        }
    }

    /// The soak, seed by seed, with the mutated file in `dir`.
    pub fn soak(&self, dir: &Path) -> Outcome {
        for &seed in &self.soak_seeds {
            let secs = self.soak_duration.as_secs_f64();
            let mut cmd = Command::new(&self.soak_binary);
            cmd.args([
                "--duration",
                &format!("{secs}s"),
                "--seed",
                &seed.to_string(),
            ]);
            let child = match spawn(cmd, dir) {
                Ok(child) => child,
                Err(outcome) => return outcome,
            };
            let violation = |line: &str| {
                let rest = line.strip_prefix("VIOLATION [")?;
                let rule = &rest[..rest.find(']')?];
                Some(format!("soak seed {seed}: {rule}"))
            };
            // The soak checks its history after the run: give it as long again and 30 s more.
            let limit = self.soak_duration * 2 + Duration::from_secs(30);
            match watch(child, Instant::now() + limit, violation) {
                Err(()) => {
                    return Outcome::Timeout {
                        what: format!("soak seed {seed}"),
                    };
                }
                Ok((Some(rule), _)) => return Outcome::Killed { by: rule },
                Ok((None, true)) => {}
                Ok((None, false)) => {
                    return Outcome::Killed {
                        by: format!("soak seed {seed}: failed without a violation"),
                    };
                }
            }
        }
        Outcome::Survived
    }
}

/// Load the library, as `redsem` assembles it with the files of `dir` in place of its own
/// (`redsem::library_source_with`), into `checker`: `Err` with Redis's message if it is refused.
fn load(dir: &Path, checker: &RedisServer) -> Result<(), String> {
    let mut conn = checker.connection();
    redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(redsem::library_source_with(dir))
        .query::<String>(&mut conn)
        .map(|_| ())
        .map_err(|e| e.to_string())
}
