//! `/v1/tenants` and `/v1/audit` (the admin key's routes).
use crate::{Client, ClientError};
use bytes::Bytes;
use ember_types::tenant::{
    AuditList, AuditRecord, CreateTenantRequest, CreatedKey, KeyInfo, KeyList, TenantInfo, TenantList,
    UpdateTenantRequest,
};
use hyper::Method;

fn enc(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, crate::COMPONENT).to_string()
}

impl Client {
    pub async fn create_tenant(&self, req: &CreateTenantRequest) -> Result<TenantInfo, ClientError> {
        let body = serde_json::to_vec(req)
            .map_err(|e| ClientError::Protocol { path: "/v1/tenants".into(), message: e.to_string() })?;
        Ok(self.json(Method::POST, "/v1/tenants", Some(body)).await?.0)
    }

    pub async fn list_tenants(&self) -> Result<Vec<TenantInfo>, ClientError> {
        Ok(self.json::<TenantList>(Method::GET, "/v1/tenants", None).await?.0.items)
    }

    pub async fn get_tenant(&self, name: &str) -> Result<TenantInfo, ClientError> {
        Ok(self.json(Method::GET, &format!("/v1/tenants/{}", enc(name)), None).await?.0)
    }

    /// Changes `name`'s quotas (a merge patch); answers the tenant with its usage.
    pub async fn update_tenant(&self, name: &str, req: &UpdateTenantRequest) -> Result<TenantInfo, ClientError> {
        let path = format!("/v1/tenants/{}", enc(name));
        let body = serde_json::to_vec(req)
            .map_err(|e| ClientError::Protocol { path: path.clone(), message: e.to_string() })?;
        Ok(self.json(Method::PATCH, &path, Some(body)).await?.0)
    }

    pub async fn delete_tenant(&self, name: &str) -> Result<(), ClientError> {
        self.delete(&format!("/v1/tenants/{}", enc(name))).await
    }

    /// A new key of `name`: the answer is the only place it is shown.
    pub async fn create_tenant_key(&self, name: &str) -> Result<CreatedKey, ClientError> {
        Ok(self.json(Method::POST, &format!("/v1/tenants/{}/keys", enc(name)), Some(Vec::new())).await?.0)
    }

    pub async fn tenant_keys(&self, name: &str) -> Result<Vec<KeyInfo>, ClientError> {
        Ok(self.json::<KeyList>(Method::GET, &format!("/v1/tenants/{}/keys", enc(name)), None).await?.0.items)
    }

    pub async fn revoke_tenant_key(&self, name: &str, prefix: &str) -> Result<(), ClientError> {
        self.delete(&format!("/v1/tenants/{}/keys/{}", enc(name), enc(prefix))).await
    }

    /// Audit records of `tenant` (all without one) from `since_ms` on.
    pub async fn audit(&self, tenant: Option<&str>, since_ms: i64) -> Result<Vec<AuditRecord>, ClientError> {
        let since = since_ms.to_string();
        let mut q = vec![("since", since.as_str())];
        if let Some(t) = tenant {
            q.push(("tenant", t));
        }
        Ok(self.json::<AuditList>(Method::GET, &format!("/v1/audit?{}", crate::query(q)), None).await?.0.items)
    }

    async fn delete(&self, path: &str) -> Result<(), ClientError> {
        let resp = self.send(Method::DELETE, path, Bytes::new(), None).await?;
        Self::check(path, resp).await.map(|_| ())
    }
}
