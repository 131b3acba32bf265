//! The object store's URL, a property of the namespace:
//! - `file:///ABSOLUTE/PATH`: a local directory (the embedded default, `DATA/objects`);
//! - `s3://BUCKET[/PREFIX][?endpoint=URL&region=R]`: any S3-compatible store; credentials come
//!   from the usual AWS environment variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//!   `AWS_SESSION_TOKEN`), the endpoint and region from the URL or from `AWS_ENDPOINT_URL` and
//!   `AWS_REGION`.

use std::path::PathBuf;

use crate::error::DataError;

/// A parsed object store URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObjectsUrl {
    File {
        root: PathBuf,
    },
    S3 {
        bucket: String,
        prefix: String,
        endpoint: Option<String>,
        region: Option<String>,
    },
}

impl ObjectsUrl {
    pub fn parse(url: &str) -> Result<ObjectsUrl, DataError> {
        let bad = |why: &str| {
            Err(DataError::Invalid(format!(
                "object store URL {url:?}: {why}"
            )))
        };
        if let Some(path) = url.strip_prefix("file://") {
            if !path.starts_with('/') {
                return bad("a file:// URL names an absolute path (file:///dir)");
            }
            if path.contains('?') || path.contains('#') {
                return bad("a file:// URL takes no query");
            }
            return Ok(ObjectsUrl::File {
                root: PathBuf::from(path),
            });
        }
        let Some(rest) = url.strip_prefix("s3://") else {
            return bad("the scheme is file:// or s3://");
        };
        let (location, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (bucket, prefix) = location.split_once('/').unwrap_or((location, ""));
        if bucket.is_empty() {
            return bad("no bucket");
        }
        let (mut endpoint, mut region) = (None, None);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("endpoint", value)) if !value.is_empty() => {
                    endpoint = Some(value.to_string())
                }
                Some(("region", value)) if !value.is_empty() => region = Some(value.to_string()),
                _ => return bad(&format!("unknown parameter {pair:?} (endpoint, region)")),
            }
        }
        Ok(ObjectsUrl::S3 {
            bucket: bucket.to_string(),
            prefix: prefix.trim_matches('/').to_string(),
            endpoint,
            region,
        })
    }

    /// The URL of a local directory.
    pub fn file(root: &std::path::Path) -> String {
        format!("file://{}", root.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_and_bad_ones_are_refused() {
        assert_eq!(
            ObjectsUrl::parse("file:///var/calm/objects").unwrap(),
            ObjectsUrl::File {
                root: "/var/calm/objects".into()
            }
        );
        assert_eq!(
            ObjectsUrl::parse("s3://bkt/some/prefix/?endpoint=http://127.0.0.1:3900&region=garage")
                .unwrap(),
            ObjectsUrl::S3 {
                bucket: "bkt".into(),
                prefix: "some/prefix".into(),
                endpoint: Some("http://127.0.0.1:3900".into()),
                region: Some("garage".into()),
            }
        );
        assert!(matches!(
            ObjectsUrl::parse("s3://bkt").unwrap(),
            ObjectsUrl::S3 { ref prefix, endpoint: None, .. } if prefix.is_empty()
        ));
        for bad in [
            "file://relative",
            "s3://",
            "s3:///x",
            "s3://b?colour=red",
            "http://x",
            "/plain/path",
        ] {
            assert!(ObjectsUrl::parse(bad).is_err(), "{bad} was taken");
        }
    }
}
