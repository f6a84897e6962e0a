//! Learning-to-rank datasets: SVMlight/LETOR files, LightGBM files with a `.query` group file (either
//! plain or gzipped), or synthetic Gaussian features. `ultr score` reads them, and the simulator
//! (`ultr_simulate::dataset`) draws its queries from them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use rand::Rng;
use rand_distr::StandardNormal;

/// One query-document pair.
#[derive(Debug, Clone)]
pub struct Doc {
    pub doc_id: String,
    /// Expert label, when the dataset has one.
    pub label: Option<f32>,
    pub features: Vec<f32>,
}

#[derive(Debug, Clone)]
pub struct Query {
    pub query_id: String,
    pub docs: Vec<Doc>,
}

#[derive(Debug, Clone)]
pub struct Dataset {
    pub queries: Vec<Query>,
    pub n_features: usize,
}

impl Dataset {
    pub fn n_docs(&self) -> usize {
        self.queries.iter().map(|q| q.docs.len()).sum()
    }

    pub fn max_label(&self) -> Option<f32> {
        self.queries.iter().flat_map(|q| &q.docs).filter_map(|d| d.label).reduce(f32::max)
    }
}

/// A parsed SVMlight line: label, optional qid, sparse features, and the `#docid = X` comment if any.
struct Line {
    label: f32,
    qid: Option<String>,
    features: Vec<(usize, f32)>,
    doc_id: Option<String>,
}

fn parse_line(line: &str, path: &Path, lineno: usize) -> anyhow::Result<Option<Line>> {
    let (data, comment) = match line.split_once('#') {
        Some((d, c)) => (d, Some(c)),
        None => (line, None),
    };
    let mut tokens = data.split_ascii_whitespace();
    let Some(label) = tokens.next() else { return Ok(None) };
    let at = || format!("{}:{}", path.display(), lineno + 1);
    let label: f32 = label.parse().with_context(|| format!("{}: bad label `{label}`", at()))?;
    let mut qid = None;
    let mut features = Vec::new();
    for tok in tokens {
        let (k, v) = tok.split_once(':').with_context(|| format!("{}: bad token `{tok}`", at()))?;
        if k == "qid" {
            qid = Some(v.to_string());
            continue;
        }
        let index: usize = k.parse().with_context(|| format!("{}: bad feature index `{k}`", at()))?;
        if index == 0 {
            bail!("{}: feature indices are 1-based", at());
        }
        let value: f32 = v.parse().with_context(|| format!("{}: bad feature value `{v}`", at()))?;
        if !value.is_finite() {
            bail!("{}: feature {index} is not finite", at());
        }
        features.push((index - 1, value));
    }
    let doc_id = comment.and_then(|c| {
        let rest = c.split("docid").nth(1)?;
        let rest = rest.trim_start().strip_prefix('=')?;
        rest.split_ascii_whitespace().next().map(str::to_string)
    });
    Ok(Some(Line { label, qid, features, doc_id }))
}

fn densify(lines: Vec<(String, Line)>) -> Dataset {
    let n_features = lines.iter().flat_map(|(_, l)| l.features.iter().map(|(i, _)| i + 1)).max().unwrap_or(0);
    let mut order: Vec<String> = Vec::new();
    let mut by_query: HashMap<String, Vec<Doc>> = HashMap::new();
    for (qid, line) in lines {
        let mut dense = vec![0f32; n_features];
        for (i, v) in line.features {
            dense[i] = v;
        }
        let docs = by_query.entry(qid.clone()).or_insert_with(|| {
            order.push(qid.clone());
            Vec::new()
        });
        let doc_id = line.doc_id.unwrap_or_else(|| format!("{qid}-{}", docs.len()));
        docs.push(Doc { doc_id, label: Some(line.label), features: dense });
    }
    let queries = order
        .into_iter()
        .map(|q| {
            let mut docs = by_query.remove(&q).unwrap_or_default();
            dedupe_doc_ids(&mut docs);
            Query { query_id: q, docs }
        })
        .collect();
    Dataset { queries, n_features }
}

/// A doc id must be unique within its query (MQ2008 repeats a few); later copies get a suffix.
fn dedupe_doc_ids(docs: &mut [Doc]) {
    let mut seen: HashMap<String, usize> = HashMap::new();
    for d in docs.iter_mut() {
        let n = seen.entry(d.doc_id.clone()).or_insert(0);
        if *n > 0 {
            d.doc_id = format!("{}#{}", d.doc_id, n);
        }
        *n += 1;
    }
}

/// Reads SVMlight/LETOR files (`label qid:Q i:v ... # docid = X`). Several files are concatenated
/// (a query id seen in two files is one query).
pub fn load_svmlight(paths: &[&Path]) -> anyhow::Result<Dataset> {
    let mut lines = Vec::new();
    for path in paths {
        let text = read_text(path)?;
        for (i, raw) in text.lines().enumerate() {
            if let Some(line) = parse_line(raw, path, i)? {
                let qid = line.qid.clone().with_context(|| format!("{}:{}: no qid (use --format lightgbm with a .query file)", path.display(), i + 1))?;
                lines.push((qid, line));
            }
        }
    }
    if lines.is_empty() {
        bail!("no documents in {:?}", paths);
    }
    Ok(densify(lines))
}

/// Reads LightGBM's ranking format: SVMlight lines without qid, grouped by a `.query` file that
/// lists documents per query in file order.
pub fn load_lightgbm(path: &Path, query_file: &Path) -> anyhow::Result<Dataset> {
    let text = read_text(path)?;
    let groups = read_text(query_file)?;
    let sizes: Vec<usize> = groups
        .split_ascii_whitespace()
        .map(|s| s.parse().with_context(|| format!("{}: bad group size `{s}`", query_file.display())))
        .collect::<anyhow::Result<_>>()?;
    let mut parsed = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        if let Some(line) = parse_line(raw, path, i)? {
            parsed.push(line);
        }
    }
    let total: usize = sizes.iter().sum();
    if total != parsed.len() {
        bail!("{} lists {total} documents but {} has {}", query_file.display(), path.display(), parsed.len());
    }
    let mut lines = Vec::with_capacity(parsed.len());
    let mut it = parsed.into_iter();
    for (q, &n) in sizes.iter().enumerate() {
        for line in it.by_ref().take(n) {
            lines.push((format!("q{q}"), line));
        }
    }
    Ok(densify(lines))
}

/// Gaussian features, so the demo and tests need no data files. No expert labels.
pub fn synthetic(queries: usize, docs_per_query: usize, n_features: usize, rng: &mut impl Rng) -> Dataset {
    let queries = (0..queries)
        .map(|q| Query {
            query_id: format!("sq{q}"),
            docs: (0..docs_per_query)
                .map(|d| Doc { doc_id: format!("sq{q}-d{d}"), label: None, features: (0..n_features).map(|_| rng.sample::<f32, _>(StandardNormal)).collect() })
                .collect(),
        })
        .collect();
    Dataset { queries, n_features }
}

/// `path` gzipped: the name with `.gz` appended.
fn gzipped(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".gz");
    PathBuf::from(name)
}

/// Whether a data file exists as named or gzipped (`NAME.gz`), the form `data/` ships.
pub fn data_file_exists(path: &Path) -> bool {
    path.is_file() || gzipped(path).is_file()
}

/// A data file's text: the file as named (decompressed when its name ends in `.gz`), else `NAME.gz`
/// decompressed, so `data/mq2008/S1.txt` names the shipped `S1.txt.gz` and an uncompressed copy
/// (under `$ULTR_DATA_DIR`) alike.
pub fn read_text(path: &Path) -> anyhow::Result<String> {
    let (file, compressed) = if path.is_file() {
        (path.to_path_buf(), path.extension().is_some_and(|e| e == "gz"))
    } else if gzipped(path).is_file() {
        (gzipped(path), true)
    } else {
        bail!("reading {}: no such file (nor {})", path.display(), gzipped(path).display());
    };
    let bytes = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
    if !compressed {
        return String::from_utf8(bytes).with_context(|| format!("{} is not UTF-8", file.display()));
    }
    let mut text = String::new();
    std::io::Read::read_to_string(&mut flate2::read::MultiGzDecoder::new(&bytes[..]), &mut text)
        .with_context(|| format!("decompressing {}", file.display()))?;
    Ok(text)
}

/// The folder holding `mq2008/` and `lightgbm-rank/`: `$ULTR_DATA_DIR` when set, else `data/` in the
/// working directory, else the repository's own `data/` (where this crate was built from).
pub fn data_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("ULTR_DATA_DIR") {
        return Some(PathBuf::from(dir));
    }
    [PathBuf::from("data"), Path::new(env!("CARGO_MANIFEST_DIR")).join("data")].into_iter().find(|d| d.join("mq2008").is_dir())
}

/// MQ2008's folder (`S1.txt` … `S5.txt`, plain or gzipped) under `data_dir()`.
pub fn default_mq2008_dir() -> Option<PathBuf> {
    data_dir().map(|d| d.join("mq2008")).filter(|d| data_file_exists(&d.join("S1.txt")))
}

/// LightGBM's rank example (`rank.train`, `rank.test` and their `.query` files) under `data_dir()`.
pub fn default_lightgbm_rank_dir() -> Option<PathBuf> {
    data_dir().map(|d| d.join("lightgbm-rank")).filter(|d| data_file_exists(&d.join("rank.train")))
}
