//! One connection per etcd member, one in use at a time (as etcd's own Go client pins an
//! endpoint): a request goes to the member in use; when it does not answer, the next member is
//! used from then on. etcd-client's own balancing over several endpoints kept sending a share
//! of the requests towards a dead member, and every operation slowed five-fold while one of
//! three members was down (`docs/design/etcd.md`, "Several members").

use std::sync::atomic::{AtomicUsize, Ordering};

use etcd_client::{Client, ConnectOptions};

pub(crate) struct Endpoints {
    endpoints: Vec<String>,
    options: ConnectOptions,
    /// A client per member, made at its first use (and kept: it reconnects by itself).
    clients: Vec<tokio::sync::Mutex<Option<Client>>>,
    active: AtomicUsize,
}

impl Endpoints {
    pub(crate) fn new(endpoints: Vec<String>, options: ConnectOptions) -> Endpoints {
        Endpoints {
            clients: endpoints.iter().map(|_| Default::default()).collect(),
            endpoints,
            options,
            active: AtomicUsize::new(0),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.endpoints.len()
    }

    /// The member in use and a client of it (connecting first if needed).
    pub(crate) async fn client(&self) -> (usize, Result<Client, etcd_client::Error>) {
        let index = self.active.load(Ordering::Acquire) % self.endpoints.len();
        let mut slot = self.clients[index].lock().await;
        if let Some(client) = &*slot {
            return (index, Ok(client.clone()));
        }
        match Client::connect([self.endpoints[index].as_str()], Some(self.options.clone())).await {
            Ok(client) => {
                *slot = Some(client.clone());
                (index, Ok(client))
            }
            Err(error) => (index, Err(error)),
        }
    }

    /// Member `index` did not answer: the next one is used from now on (unless another
    /// request moved on already).
    pub(crate) fn failed(&self, index: usize) {
        let next = (index + 1) % self.endpoints.len();
        let _ = self
            .active
            .compare_exchange(index, next, Ordering::AcqRel, Ordering::Acquire);
    }
}
