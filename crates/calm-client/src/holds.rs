//! The stream on which a server asks a mount for the files it holds (`Meta.Holds`).

use super::*;

/// Where the recalls come from: a connection, or the server in this process.
pub enum RecallStream {
    Remote(Box<tonic::Streaming<pb::Recalls>>),
    Local(LocalRecallStream),
}

impl std::fmt::Debug for RecallStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RecallStream::Remote(..) => "RecallStream::Remote",
            RecallStream::Local(..) => "RecallStream::Local",
        })
    }
}

impl RecallStream {
    /// The next files the server asks back; `None` once the stream ended (the holds ended
    /// with it).
    pub async fn next(&mut self) -> Result<Option<Vec<Handle>>> {
        let recalls = match self {
            RecallStream::Remote(stream) => stream.message().await,
            RecallStream::Local(stream) => {
                use tokio_stream::StreamExt;
                stream.next().await.transpose()
            }
        };
        recalls
            .map(|r| r.map(|r| r.handles))
            .map_err(|s| error_from_status(&s))
    }
}

impl Client {
    /// Opens the stream on which the server asks for the files the caller's session holds.
    /// A server that shares its store with others grants no holds (`Unsupported`).
    pub async fn holds(&self) -> Result<RecallStream> {
        let mut request = self.tagged(pb::SessionRequest::default(), None);
        match &self.local {
            Some(local) => {
                request.extensions_mut().insert(calm_proto::InProcess);
                let stream = check(local.meta.holds(request).await)?;
                Ok(RecallStream::Local(stream))
            }
            None => {
                let stream = check(self.conn().rpc.clone().holds(request).await)?;
                Ok(RecallStream::Remote(Box::new(stream)))
            }
        }
    }
}
