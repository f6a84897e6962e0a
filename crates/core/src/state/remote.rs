//! The state in an object store (S3 or any S3-compatible server, or a local folder), through the
//! `object_store` crate. A copy of a state directory is one record object (`state.json`: the
//! manifest and which object holds each file) plus the files, uploaded before the record replaces
//! the previous one, so the record always names objects that are there. Each copy has one writer:
//! taking a copy over raises its epoch with a conditional write, and a writer whose conditional
//! write then fails has been fenced off (`Fenced`).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};
use serde::{Deserialize, Serialize};

use super::{Manifest, MANIFEST};

/// `[state.object_store]`: where several instances keep their partitions' state and the merged
/// view. Unset, the state is the local `--state` directory of one instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ObjectStoreConfig {
    /// `s3://bucket/prefix`: S3 or an S3-compatible server that honours conditional writes
    /// (If-None-Match, If-Match), which the lease and the fencing rely on.
    pub url: String,
    /// Options of the store, as `object_store` names them: `aws_endpoint`, `aws_region`,
    /// `aws_access_key_id`, `aws_secret_access_key`, `aws_allow_http`, ... A value `env:NAME` is
    /// read from environment variable NAME and `file:PATH` from a file, as Kafka properties are.
    #[serde(default)]
    pub options: BTreeMap<String, String>,
    /// How often the lease holder merges the partitions' windows into the merged view (and the
    /// other instances fetch it).
    #[serde(default = "default_compact_interval")]
    pub compact_interval: crate::units::ConfigDuration,
    /// How long the compactor's lease lasts without renewal; another instance takes over after it.
    #[serde(default = "default_lease_ttl")]
    pub lease_ttl: crate::units::ConfigDuration,
}

impl ObjectStoreConfig {
    /// Refuses an option key `object_store` does not know: `parse_url_opts` drops such keys
    /// silently, so a typo (`aws_endpiont`) would send the client to real AWS with default settings.
    pub fn check_option_keys(&self) -> Result<(), String> {
        use std::str::FromStr;
        for key in self.options.keys() {
            if object_store::aws::AmazonS3ConfigKey::from_str(&key.to_ascii_lowercase()).is_err() {
                return Err(format!(
                    "key `state.object_store.options.{key}` is not an S3 option object_store knows (e.g. aws_endpoint, aws_region, aws_access_key_id, aws_secret_access_key, aws_allow_http)"
                ));
            }
        }
        Ok(())
    }
}

fn default_compact_interval() -> crate::units::ConfigDuration {
    crate::units::duration("30s")
}

fn default_lease_ttl() -> crate::units::ConfigDuration {
    crate::units::duration("90s")
}

/// An object store opened from `[state.object_store]`, with a runtime of its own so the
/// synchronous pipeline can call it from any thread.
pub struct Remote {
    store: Arc<dyn ObjectStore>,
    prefix: ObjectPath,
    runtime: crate::context::Runner,
    pub url: String,
}

impl Remote {
    pub fn open(config: &ObjectStoreConfig, context: &crate::context::PipelineContext) -> anyhow::Result<Remote> {
        let url = url::Url::parse(&config.url).with_context(|| format!("key `state.object_store.url` = {:?} is not a URL", config.url))?;
        config.check_option_keys().map_err(|e| anyhow::anyhow!(e))?;
        let options = crate::sources::secrets::resolve_properties(&config.options).context("[state.object_store] options")?;
        let (store, prefix) = object_store::parse_url_opts(&url, options)
            .with_context(|| format!("key `state.object_store.url` = {:?}: cannot open this object store", config.url))?;
        let runtime = context.runner("ultr-object-store")?;
        Ok(Remote { store: Arc::from(store), prefix, runtime, url: config.url.clone() })
    }

    fn path(&self, rel: &str) -> ObjectPath {
        let mut p = self.prefix.clone();
        for part in rel.split('/').filter(|s| !s.is_empty()) {
            p = p.clone().join(part);
        }
        p
    }

    /// The object at `rel` (under the prefix), None when absent.
    pub fn get(&self, rel: &str) -> anyhow::Result<Option<Vec<u8>>> {
        let path = self.path(rel);
        self.runtime.run(async {
            match self.store.get(&path).await {
                Ok(r) => Ok(Some(r.bytes().await.with_context(|| format!("reading {path} from {}", self.url))?.to_vec())),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(anyhow::Error::new(e).context(format!("reading {path} from {}", self.url))),
            }
        })
    }

    pub fn put(&self, rel: &str, bytes: Vec<u8>) -> anyhow::Result<()> {
        let path = self.path(rel);
        self.runtime.run(self.store.put(&path, PutPayload::from(bytes))).with_context(|| format!("writing {path} to {}", self.url))?;
        Ok(())
    }

    /// Relative paths of every object under `rel/`.
    pub fn list(&self, rel: &str) -> anyhow::Result<Vec<String>> {
        let base = self.path(rel);
        let prefix_len = self.prefix.as_ref().len();
        self.runtime.run(async {
            let metas: Vec<object_store::ObjectMeta> =
                self.store.list(Some(&base)).try_collect().await.with_context(|| format!("listing {base} in {}", self.url))?;
            Ok(metas.into_iter().map(|m| m.location.as_ref()[prefix_len..].trim_start_matches('/').to_string()).collect())
        })
    }

    fn delete(&self, rel: &str) -> anyhow::Result<()> {
        let path = self.path(rel);
        match self.runtime.run(self.store.delete(&path)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(anyhow::Error::new(e).context(format!("deleting {path} in {}", self.url))),
        }
    }

    /// The copy under `prefix`, with its version (e-tag); None when there is none.
    fn record(&self, prefix: &str) -> anyhow::Result<Option<(Record, Option<String>)>> {
        let Some((bytes, e_tag)) = self.get_versioned(&format!("{prefix}/{RECORD}"))? else { return Ok(None) };
        let record: Record = serde_json::from_slice(&bytes).with_context(|| format!("{prefix}/{RECORD} in {} is not an ultr state record", self.url))?;
        Ok(Some((record, e_tag)))
    }

    /// The manifest of the copy under `prefix`, None when there is none.
    pub fn manifest(&self, prefix: &str) -> anyhow::Result<Option<Manifest>> {
        Ok(self.record(prefix)?.map(|(r, _)| r.manifest))
    }

    /// Becomes the only writer of the copy under `prefix` and replaces `dir` with it. The record's
    /// epoch is raised with a write conditional on the version read, so a writer that held the copy
    /// before (an instance the group gave up on, still running) fails its next push: it is fenced.
    /// Returns the writer and whether there was a copy.
    pub fn take_over(&self, prefix: &str, dir: &Path) -> anyhow::Result<(Writer, bool)> {
        loop {
            let Some((mut record, e_tag)) = self.record(prefix)? else {
                clear_dir(dir)?;
                return Ok((Writer { prefix: prefix.to_string(), epoch: 1, e_tag: None, objects: BTreeMap::new() }, false));
            };
            record.epoch += 1;
            let bytes = serde_json::to_vec(&record)?;
            let Some(new_tag) =
                self.put_if_tagged(&format!("{prefix}/{RECORD}"), bytes, Some(e_tag.context("the object store returned no e-tag: it cannot fence writers")?))?
            else {
                continue; // another writer moved it on between the read and the write: read again
            };
            self.download(prefix, &record, dir)?;
            return Ok((Writer { prefix: prefix.to_string(), epoch: record.epoch, e_tag: new_tag, objects: record.objects }, true));
        }
    }

    /// Replaces `dir` with the copy under `prefix` without writing (a reader of the merged view).
    /// Only what changed is downloaded: the objects the last fetch into `dir` wrote and the record
    /// still names under the same key stay (an object is written once, so the same key is the same
    /// bytes); every other file in `dir` is removed, as a fresh download would leave it. Returns
    /// false when there is no copy.
    pub fn fetch(&self, prefix: &str, dir: &Path) -> anyhow::Result<bool> {
        let Some((record, _)) = self.record(prefix)? else { return Ok(false) };
        let fetched = dir.join(FETCHED);
        let previous: BTreeMap<String, StoredObject> =
            fs::read(&fetched).ok().and_then(|b| serde_json::from_slice(&b).ok()).filter(|_| dir.join(MANIFEST).exists()).unwrap_or_default();
        if previous.is_empty() {
            self.download(prefix, &record, dir)?;
        } else {
            // The list goes first: a fetch that fails half-way leaves no list, and the next one
            // downloads everything.
            fs::remove_file(&fetched).with_context(|| format!("removing {}", fetched.display()))?;
            prune(dir, dir, &record.objects)?;
            for (rel, object) in &record.objects {
                let kept = previous.get(rel) == Some(object) && fs::metadata(dir.join(rel)).is_ok_and(|m| m.len() == object.bytes);
                if !kept {
                    self.download_object(prefix, rel, object, dir)?;
                }
            }
            self.write_manifest(&record, dir)?;
        }
        fs::write(&fetched, serde_json::to_vec(&record.objects)?).with_context(|| format!("writing {}", fetched.display()))?;
        Ok(true)
    }

    fn download(&self, prefix: &str, record: &Record, dir: &Path) -> anyhow::Result<()> {
        clear_dir(dir)?;
        for (rel, object) in &record.objects {
            self.download_object(prefix, rel, object, dir)?;
        }
        self.write_manifest(record, dir)
    }

    /// The object holding state file `rel`, checked against its recorded length, written to `dir`.
    fn download_object(&self, prefix: &str, rel: &str, object: &StoredObject, dir: &Path) -> anyhow::Result<()> {
        let bytes = self
            .get(&format!("{prefix}/{}", object.key))?
            .with_context(|| format!("{prefix}/{} in {} is named by its record but missing", object.key, self.url))?;
        anyhow::ensure!(
            bytes.len() as u64 == object.bytes,
            "{prefix}/{} in {} is {} bytes but its record says {}",
            object.key,
            self.url,
            bytes.len(),
            object.bytes
        );
        let local = dir.join(rel);
        if let Some(parent) = local.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(&local, bytes).with_context(|| format!("writing {}", local.display()))
    }

    /// The record's manifest into `dir` (atomically), beside the state folders, then `dir` synced.
    fn write_manifest(&self, record: &Record, dir: &Path) -> anyhow::Result<()> {
        for sub in ["windows", "open", "late"] {
            fs::create_dir_all(dir.join(sub))?;
        }
        let tmp = dir.join(".tmp-manifest.json");
        fs::write(&tmp, serde_json::to_vec_pretty(&record.manifest)?)?;
        fs::rename(&tmp, dir.join(MANIFEST))?;
        super::sync_dir(dir)
    }

    /// Copies the checkpoint in `dir` to the writer's copy: the files its manifest names that the
    /// copy lacks go to `e<epoch>/` objects, then the record (manifest + object names) is replaced
    /// only if it is still the version this writer wrote last — otherwise the writer was fenced and
    /// this fails with `Fenced`. Then objects of this or older epochs that the record no longer
    /// names are deleted (never a newer writer's).
    pub fn push(&self, w: &mut Writer, dir: &Path) -> anyhow::Result<()> {
        let manifest = super::read_manifest(dir)?;
        let mut files: Vec<String> = manifest.named_files().into_iter().map(|(rel, _)| rel).collect();
        if dir.join(DEAD_LETTERS).exists() {
            files.push(DEAD_LETTERS.to_string());
        }
        let mut objects = BTreeMap::new();
        for rel in files {
            let local = dir.join(&rel);
            let bytes = fs::metadata(&local).with_context(|| format!("state file {} named by the manifest is missing", local.display()))?.len();
            match w.objects.get(&rel) {
                // State files are immutable once named; the dead-letter file only grows.
                Some(o) if o.bytes == bytes => {
                    objects.insert(rel, o.clone());
                }
                _ => {
                    // Every object is written once: the dead-letter file, the one state file that
                    // changes, gets a key per checkpoint, so a fenced writer still uploading can never
                    // overwrite an object the current record names.
                    let key = if rel == DEAD_LETTERS { format!("e{}/{rel}.{}", w.epoch, manifest.seq) } else { format!("e{}/{rel}", w.epoch) };
                    self.put(&format!("{}/{key}", w.prefix), fs::read(&local).with_context(|| format!("reading {}", local.display()))?)?;
                    objects.insert(rel, StoredObject { key, bytes });
                }
            }
        }
        let record = Record { epoch: w.epoch, objects, manifest };
        let Some(tag) = self.put_if_tagged(&format!("{}/{RECORD}", w.prefix), serde_json::to_vec(&record)?, w.e_tag.clone())? else {
            return Err(anyhow::Error::new(Fenced { prefix: w.prefix.clone() }));
        };
        w.e_tag = tag;
        w.objects = record.objects;
        let named: BTreeSet<&str> = w.objects.values().map(|o| o.key.as_str()).collect();
        for rel in self.list(&w.prefix)? {
            let Some(key) = rel.strip_prefix(&format!("{}/", w.prefix)) else { continue };
            let epoch = key.strip_prefix('e').and_then(|k| k.split('/').next()).and_then(|e| e.parse::<u64>().ok());
            if epoch.is_some_and(|e| e <= w.epoch) && !named.contains(key) {
                self.delete(&rel)?;
            }
        }
        Ok(())
    }

    /// Brings `dir` up to the closed windows of the copy under `prefix` (for merging): the window
    /// files its manifest names that `dir` lacks, then the manifest; window folders it no longer
    /// names are removed. Open windows and late segments are not copied.
    pub fn sync_windows(&self, prefix: &str, dir: &Path) -> anyhow::Result<()> {
        let Some((record, _)) = self.record(prefix)? else { return Ok(()) };
        fs::create_dir_all(dir.join("windows"))?;
        let mut keep = BTreeSet::new();
        for w in &record.manifest.windows {
            keep.insert(w.dir.clone());
            for table in w.files.keys() {
                let rel = format!("windows/{}/{table}.parquet", w.dir);
                let object = record.objects.get(&rel).with_context(|| format!("{prefix}/{RECORD} in {} names no object for {rel}", self.url))?;
                if fs::metadata(dir.join(&rel)).map(|m| m.len() == object.bytes).unwrap_or(false) {
                    continue;
                }
                self.download_object(prefix, &rel, object, dir)?;
            }
        }
        for e in fs::read_dir(dir.join("windows"))?.flatten() {
            if !keep.contains(e.file_name().to_string_lossy().as_ref()) {
                let _ = fs::remove_dir_all(e.path());
            }
        }
        fs::write(dir.join(MANIFEST), serde_json::to_vec_pretty(&record.manifest)?)?;
        Ok(())
    }

    /// Writes `bytes` at `rel` only if the object is absent (`expected` None) or still the version
    /// `expected` (an e-tag): false when another writer got there first.
    pub fn put_if(&self, rel: &str, bytes: Vec<u8>, expected: Option<String>) -> anyhow::Result<bool> {
        Ok(self.put_if_tagged(rel, bytes, expected)?.is_some())
    }

    /// `put_if` returning the new version's e-tag (Some) or None when another writer got there first.
    fn put_if_tagged(&self, rel: &str, bytes: Vec<u8>, expected: Option<String>) -> anyhow::Result<Option<Option<String>>> {
        let path = self.path(rel);
        let mode = match expected {
            None => PutMode::Create,
            Some(e_tag) => PutMode::Update(UpdateVersion { e_tag: Some(e_tag), version: None }),
        };
        match self.runtime.run(self.store.put_opts(&path, PutPayload::from(bytes), PutOptions::from(mode))) {
            Ok(r) => Ok(Some(r.e_tag)),
            Err(object_store::Error::AlreadyExists { .. }) | Err(object_store::Error::Precondition { .. }) => Ok(None),
            Err(e) => Err(anyhow::Error::new(e).context(format!("writing {path} to {} conditionally", self.url))),
        }
    }

    /// The object at `rel` with its e-tag, None when absent.
    pub fn get_versioned(&self, rel: &str) -> anyhow::Result<Option<(Vec<u8>, Option<String>)>> {
        let path = self.path(rel);
        self.runtime.run(async {
            match self.store.get(&path).await {
                Ok(r) => {
                    let e_tag = r.meta.e_tag.clone();
                    Ok(Some((r.bytes().await.with_context(|| format!("reading {path} from {}", self.url))?.to_vec(), e_tag)))
                }
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(anyhow::Error::new(e).context(format!("reading {path} from {}", self.url))),
            }
        })
    }
}

/// The object naming a copy's manifest and the objects holding its files.
pub const RECORD: &str = "state.json";

/// Where one state file of a copy lives.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StoredObject {
    /// Under the copy's prefix: `e<epoch of the writer that uploaded it>/<path in the state>`.
    pub key: String,
    pub bytes: u64,
}

/// A copy of a state directory in the store: one object, replaced atomically.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    /// Raised by every writer that takes the copy over (fencing the ones before it).
    pub epoch: u64,
    /// Path in the state directory → the object holding it.
    pub objects: BTreeMap<String, StoredObject>,
    pub manifest: Manifest,
}

/// The only writer of one copy (a partition task, or the compactor for the merged view).
#[derive(Debug)]
pub struct Writer {
    prefix: String,
    epoch: u64,
    /// Version of the record this writer wrote or took over; None before its first write.
    e_tag: Option<String>,
    objects: BTreeMap<String, StoredObject>,
}

/// Another writer took the copy over: this one must stop writing it.
#[derive(Debug, thiserror::Error)]
#[error("{prefix}: another instance took this state over (its epoch is newer); this writer stops")]
pub struct Fenced {
    pub prefix: String,
}

fn clear_dir(dir: &Path) -> anyhow::Result<()> {
    if dir.exists() {
        fs::remove_dir_all(dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}

/// Removes every file under `dir` (and the folders left empty) that is not the manifest or a state
/// file `objects` names; `root` is the copy's top folder.
fn prune(root: &Path, dir: &Path, objects: &BTreeMap<String, StoredObject>) -> anyhow::Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            prune(root, &path, objects)?;
            let _ = fs::remove_dir(&path); // only when empty
            continue;
        }
        let rel = path.strip_prefix(root).expect("under the copy").to_string_lossy().replace('\\', "/");
        if rel != MANIFEST && !objects.contains_key(&rel) {
            fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
    }
    Ok(())
}

/// In a fetched copy: the objects that fetch wrote there (path → object), so the next fetch
/// downloads only what changed.
const FETCHED: &str = ".fetched-objects.json";

/// The dead-letter file a partition's state carries (letters go with the records they replace).
pub const DEAD_LETTERS: &str = "dead-letters.jsonl";

/// The object-store prefix of one partition's state: `partitions/<topic>/<partition>`.
pub fn partition_prefix(topic: &str, partition: i32) -> String {
    format!("partitions/{topic}/{partition}")
}

/// The prefix of the merged view.
pub const MERGED_PREFIX: &str = "merged";

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    /// A store in a local folder (object_store's `file://`), for tests.
    pub(crate) fn local_remote(dir: &Path) -> Remote {
        fs::create_dir_all(dir).unwrap();
        let config = ObjectStoreConfig {
            url: format!("file://{}", dir.display()),
            options: BTreeMap::new(),
            compact_interval: default_compact_interval(),
            lease_ttl: default_lease_ttl(),
        };
        Remote::open(&config, &Default::default()).unwrap()
    }

    /// Regression (a mutation of `list` to return nothing survived the tests): `list`
    /// returns every object under the folder asked for, by its path relative to the store's prefix,
    /// and nothing under a sibling folder whose name starts the same.
    pub fn list_names_every_object_under_a_folder_and_none_beside_it() {
        let root = tempfile::tempdir().unwrap();
        let remote = local_remote(&root.path().join("store"));
        for key in ["p/a/1", "p/a/sub/2", "p/ab/3", "p/b/4"] {
            remote.put(key, key.as_bytes().to_vec()).unwrap();
        }
        let mut listed = remote.list("p/a").unwrap();
        listed.sort();
        assert_eq!(listed, vec!["p/a/1".to_string(), "p/a/sub/2".to_string()]);
        assert!(remote.list("p/none").unwrap().is_empty());
    }

    /// Writes `files` (state path, object key, bytes) and a record naming them under `prefix`.
    fn publish(remote: &Remote, prefix: &str, manifest: &Manifest, files: &[(&str, &str, &[u8])]) {
        let mut objects = BTreeMap::new();
        for (rel, key, bytes) in files {
            remote.put(&format!("{prefix}/{key}"), bytes.to_vec()).unwrap();
            objects.insert(rel.to_string(), StoredObject { key: key.to_string(), bytes: bytes.len() as u64 });
        }
        let record = Record { epoch: 1, objects, manifest: manifest.clone() };
        remote.put(&format!("{prefix}/{RECORD}"), serde_json::to_vec(&record).unwrap()).unwrap();
    }

    /// Every file under `dir` (path relative to it → bytes), the fetch's own list left out.
    fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
        fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
            for e in fs::read_dir(dir).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    walk(root, &p, out);
                } else if !p.ends_with(FETCHED) {
                    out.insert(p.strip_prefix(root).unwrap().to_string_lossy().into_owned(), fs::read(&p).unwrap());
                }
            }
        }
        let mut out = BTreeMap::new();
        walk(dir, dir, &mut out);
        out
    }

    /// A second fetch leaves the folder exactly as a fresh download of the new copy would (a file
    /// the copy dropped and a stray local file gone, a new one there), and rewrites no file whose
    /// object is unchanged (its modification time, set to 2001, stays).
    pub fn a_fetch_downloads_only_changed_objects_and_leaves_the_copy_exactly() {
        let root = tempfile::tempdir().unwrap();
        let remote = local_remote(&root.path().join("store"));
        let spec = crate::window::operator::WindowSpec { size_ms: 60_000, slide_ms: 60_000, allowed_lateness_ms: 0, idle_timeout_ms: 0 };
        let holdout = crate::window::Holdout { validation: 0.1, evaluation: 0.1 };
        let manifest = super::super::StateStore::open(&root.path().join("fresh"), "test", spec, holdout).unwrap().manifest().clone();

        publish(
            &remote,
            "merged",
            &manifest,
            &[("windows/w1/a.parquet", "e1/windows/w1/a.parquet", b"aaaa"), ("windows/w2/b.parquet", "e1/windows/w2/b.parquet", b"bb")],
        );
        let dir = root.path().join("reader");
        assert!(remote.fetch("merged", &dir).unwrap());
        let a = dir.join("windows/w1/a.parquet");
        let old = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        fs::File::options().write(true).open(&a).unwrap().set_modified(old).unwrap();
        fs::create_dir_all(dir.join("models")).unwrap();
        fs::write(dir.join("models/stray.json"), b"{}").unwrap();

        publish(
            &remote,
            "merged",
            &manifest,
            &[("windows/w1/a.parquet", "e1/windows/w1/a.parquet", b"aaaa"), ("windows/w3/c.parquet", "e2/windows/w3/c.parquet", b"ccc")],
        );
        assert!(remote.fetch("merged", &dir).unwrap());
        assert_eq!(fs::metadata(&a).unwrap().modified().unwrap(), old, "the unchanged object was downloaded again");
        assert!(!dir.join("windows/w2").exists(), "the dropped window's folder is gone");
        let fresh = root.path().join("fresh-reader");
        assert!(remote.fetch("merged", &fresh).unwrap());
        assert_eq!(files(&dir), files(&fresh));
        assert_eq!(files(&dir).get("windows/w3/c.parquet").map(Vec::as_slice), Some(&b"ccc"[..]));
    }
}
