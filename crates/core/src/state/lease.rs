//! The compactor's lease: one object in the store naming its holder and when it expires, taken and
//! renewed with conditional writes (create-if-absent, replace-if-unchanged), so at most one
//! instance merges the partitions and runs the training schedule at a time.

use serde::{Deserialize, Serialize};

use super::remote::Remote;

/// Where the lease lives under the store's prefix.
pub const LEASE: &str = "leases/compactor.json";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LeaseRecord {
    pub holder: String,
    pub expires_unix_ms: i64,
}

/// Takes or renews the lease for `holder` for `ttl_ms`: true when `holder` holds it afterwards.
/// A lease held by another instance is taken only once it has expired; two instances racing for
/// it both write conditionally on the version they read, so one of them loses.
pub fn try_acquire(remote: &Remote, holder: &str, ttl_ms: i64, now_ms: i64) -> anyhow::Result<bool> {
    let next = serde_json::to_vec(&LeaseRecord { holder: holder.to_string(), expires_unix_ms: now_ms + ttl_ms })?;
    match remote.get_versioned(LEASE)? {
        None => remote.put_if(LEASE, next, None),
        Some((bytes, e_tag)) => {
            let current: Option<LeaseRecord> = serde_json::from_slice(&bytes).ok();
            let free = match &current {
                Some(l) => l.holder == holder || l.expires_unix_ms <= now_ms,
                None => true, // unreadable: whoever rewrites it first holds it
            };
            if !free {
                return Ok(false);
            }
            match e_tag {
                Some(tag) => remote.put_if(LEASE, next, Some(tag)),
                None => anyhow::bail!("the object store returned no e-tag for {LEASE}: it cannot hold a lease (conditional writes are needed)"),
            }
        }
    }
}

/// Gives the lease up (on a clean stop) so another instance need not wait for it to expire.
pub fn release(remote: &Remote, holder: &str) -> anyhow::Result<()> {
    if let Some((bytes, Some(tag))) = remote.get_versioned(LEASE)? {
        if serde_json::from_slice::<LeaseRecord>(&bytes).map(|l| l.holder == holder).unwrap_or(false) {
            let expired = serde_json::to_vec(&LeaseRecord { holder: holder.to_string(), expires_unix_ms: 0 })?;
            remote.put_if(LEASE, expired, Some(tag))?;
        }
    }
    Ok(())
}

/// The current holder, if the lease is live.
pub fn holder(remote: &Remote, now_ms: i64) -> anyhow::Result<Option<String>> {
    Ok(remote.get_versioned(LEASE)?.and_then(|(b, _)| serde_json::from_slice::<LeaseRecord>(&b).ok()).filter(|l| l.expires_unix_ms > now_ms).map(|l| l.holder))
}

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    use super::*;

    /// Regression (a mutation of the holder comparison survived the tests): a lease that
    /// another instance holds and that has not expired is refused, and the record still names its
    /// holder; the first instance took it on an empty store; `holder` names a until the lease
    /// expires, and no one after.
    pub fn an_unexpired_lease_is_refused_to_another_holder_and_names_its_holder_until_it_expires() {
        let root = tempfile::tempdir().unwrap();
        let remote = crate::state::remote::tests::local_remote(&root.path().join("store"));
        assert!(try_acquire(&remote, "a", 1_000, 0).unwrap(), "an empty store's lease is free");
        assert!(!try_acquire(&remote, "b", 1_000, 500).unwrap(), "b took a's unexpired lease");
        let record: LeaseRecord = serde_json::from_slice(&remote.get(LEASE).unwrap().unwrap()).unwrap();
        assert_eq!(record, LeaseRecord { holder: "a".into(), expires_unix_ms: 1_000 });
        assert_eq!(holder(&remote, 999).unwrap().as_deref(), Some("a"), "a holds the lease until it expires");
        assert_eq!(holder(&remote, 1_000).unwrap(), None, "an expired lease has no holder");
    }
}
