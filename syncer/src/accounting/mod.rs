//! What tenants use and may use: the per-tenant [`quota`] ledger that holds pods and objects over a
//! tenant's quota, and the [`usage`] measured for chargeback (`status.usage`, per-tenant series).

pub mod quota;
pub mod usage;
