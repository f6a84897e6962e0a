//! Exclusive directory locks: one writer per state or models directory, across processes.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

/// Held while a process writes a directory; released when dropped (or when the process dies, since
/// the operating system drops the lock with the file descriptor — a kill -9 leaves no stale lock).
#[derive(Debug)]
pub struct DirLock {
    _file: File,
    path: PathBuf,
}

impl DirLock {
    /// Takes the lock on `dir/.lock` without waiting; `what` names the directory's role in errors.
    pub fn acquire(dir: &Path, what: &str) -> anyhow::Result<DirLock> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {what} {}", dir.display()))?;
        let path = dir.join(LOCK_FILE);
        let file = OpenOptions::new().create(true).truncate(false).write(true).open(&path).with_context(|| format!("opening lock file {}", path.display()))?;
        match file.try_lock() {
            Ok(()) => Ok(DirLock { _file: file, path }),
            Err(TryLockError::WouldBlock) => {
                bail!("{what} {} is in use by another ultr process (lock {} is held); run one writer per directory", dir.display(), path.display())
            }
            Err(TryLockError::Error(e)) => Err(e).with_context(|| format!("locking {}", path.display())),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The lock file's name inside a locked directory.
pub const LOCK_FILE: &str = ".lock";

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    use super::*;

    pub fn a_second_writer_is_refused_until_the_first_releases() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(dir.path(), "state directory").unwrap();
        let err = DirLock::acquire(dir.path(), "state directory").unwrap_err().to_string();
        assert!(err.contains("in use by another ultr process"), "{err}");
        drop(first);
        DirLock::acquire(dir.path(), "state directory").unwrap();
    }
}
