//! Phase 3, **authorize**: the model against the proxy key, then (through a shared
//! upstream key) every object the request names against its tenant.

use crate::auth::Admission;
use crate::error::ApiError;
use crate::state::{AppState, Snapshot};

/// What a body claims, for **authorize**: the model it names and the upstream objects
/// it (and its path) name, the latter only read through a shared upstream key.
#[derive(Debug, Default)]
pub(super) struct Claims {
    pub(super) model: Option<String>,
    /// The model the path names, where the API puts it there (Gemini).
    pub(super) path_model: Option<String>,
    /// What a batch's requests run, when the request creates one.
    pub(super) batch: Option<crate::named_model::Batch>,
    pub(super) objects: Vec<String>,
    /// Id-like keys the body holds that no API's table knows (through a shared key).
    pub(super) unknown_ids: Vec<String>,
}

/// Checks `claims` against `admission` (and, through a shared upstream key, the tenant's objects).
pub(super) async fn authorize(
    state: &AppState,
    snap: &Snapshot,
    admission: &Admission,
    claims: &Claims,
) -> Result<(), ApiError> {
    let batch = claims.batch.as_ref();
    let nested = batch.map_or(&[][..], |batch| batch.models.as_slice());
    for model in claims.model.iter().chain(&claims.path_model).chain(nested) {
        admission.check_model(model)?;
    }
    if batch.is_some_and(|batch| batch.from_file) {
        admission.check_unread_models("a batch over an uploaded file")?;
    }
    if snap.credentials.shares_upstream_key() {
        if let Some(key) = claims.unknown_ids.first() {
            if !snap.config.upstream.pass_unknown_ids {
                return Err(ApiError::forbidden(format!(
                    "{key:?} names an object whose owner handoff cannot know: through a shared upstream key, a field that names an object must be one handoff records owners for (upstream.pass_unknown_ids lets such fields through)"
                )));
            }
        }
        state
            .check_owned(&admission.tenant, &claims.objects)
            .await?;
    }
    Ok(())
}
