//! This store's tenant (`protocol::tenant`): object requests of a tenant other than the
//! default travel in the tenant envelope, and the catalog entries of its replicas are kept
//! under scoped keys, so that a master rebuilding its index puts them back in the tenant's
//! key space (`docs/recovery.md`).

use std::borrow::Cow;
use std::sync::Arc;

use protocol::message::{tenant_scoped, Rpc, Tenanted};
use protocol::tenant::{scoped_key, DEFAULT_TENANT};
use protocol::ErrorCode;

use crate::master::{ClientError, MasterClient};

/// The master as this store's tenant sees it.
pub(super) struct TenantMaster {
    client: Arc<MasterClient>,
    /// `None`: the default tenant (requests go bare, as before tenants).
    tenant: Option<String>,
}

impl TenantMaster {
    pub fn new(client: Arc<MasterClient>, tenant: &str) -> TenantMaster {
        let tenant = (!tenant.is_empty() && tenant != DEFAULT_TENANT).then(|| tenant.to_string());
        TenantMaster { client, tenant }
    }

    /// One call, in this store's tenant when the request belongs to one.
    pub fn call<R: Rpc>(&self, req: &R) -> Result<Result<R::Reply, ErrorCode>, ClientError> {
        match &self.tenant {
            Some(t) if tenant_scoped(R::OP) => self.client.call(&Tenanted {
                tenant: t.clone(),
                inner: req.clone(),
            }),
            _ => self.client.call(req),
        }
    }

    /// [`MasterClient::call_settling`] (a put's commit or revoke), in this store's tenant.
    pub fn call_settling<R: Rpc>(
        &self,
        req: &R,
    ) -> Result<Result<R::Reply, ErrorCode>, ClientError> {
        match &self.tenant {
            Some(t) if tenant_scoped(R::OP) => self.client.call_settling(&Tenanted {
                tenant: t.clone(),
                inner: req.clone(),
            }),
            _ => self.client.call_settling(req),
        }
    }

    /// The key a replica of `key` is recorded under in its owner's catalog.
    /// Whether this store works in a named tenant.
    pub fn tenanted(&self) -> bool {
        self.tenant.is_some()
    }

    /// The master's address, for error causes.
    pub fn addr(&self) -> &str {
        self.client.addr()
    }

    pub fn catalog_key<'k>(&self, key: &'k str) -> Cow<'k, str> {
        match &self.tenant {
            Some(t) => Cow::Owned(scoped_key(t, key)),
            None => Cow::Borrowed(key),
        }
    }
}
