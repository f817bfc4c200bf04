//! OCI images as guest roots: `vm_sandbox.images.pull/import_/list/remove` over the default
//! [`vm_sandbox::oci::Store`] (what `vm images pull|import|ls|rm` use). An image is a dict:
//! `digest`, `refs`, `size`, `erofs`, `source`.

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use vm_sandbox::oci;

use crate::failure::Failure;
use crate::{blocking, runtime};

/// The default store; `None` when it does not exist and `create` is false.
fn store(create: bool) -> Result<Option<oci::Store>, Failure> {
    let dir = oci::default_dir().ok_or(oci::Error::NoDir)?;
    if !create && !dir.is_dir() {
        return Ok(None);
    }
    Ok(Some(oci::Store::open(dir)?))
}

fn reference(field: &str, s: &str) -> Result<oci::Reference, Failure> {
    s.parse()
        .map_err(|e| Failure::refused(field, format!("invalid image reference {s:?}: {e}")))
}

fn image_dict<'py>(py: Python<'py>, i: &oci::Image) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("digest", i.digest.to_string())?;
    d.set_item("refs", i.refs.clone())?;
    d.set_item("size", i.size)?;
    d.set_item("erofs", i.erofs.clone())?;
    d.set_item("source", i.source.clone())?;
    Ok(d)
}

/// Pulls `reference` (credentials from the docker `config.json`) into the store.
#[pyfunction]
fn images_pull<'py>(py: Python<'py>, reference: &str) -> PyResult<Bound<'py, PyDict>> {
    let r = self::reference("reference", reference)?;
    let image = blocking(py, move || {
        let store = store(true)?.expect("created");
        let auth = oci::Auth::from_docker_config(&r).map_err(|e| Failure::from_error(&e))?;
        Ok(runtime().block_on(store.pull(&r, &auth))?)
    })?;
    image_dict(py, &image)
}

/// Imports an OCI layout directory, an oci-archive or a `docker save` tarball, named `names`.
#[pyfunction]
#[pyo3(signature = (path, names=vec![]))]
fn images_import<'py>(
    py: Python<'py>,
    path: PathBuf,
    names: Vec<String>,
) -> PyResult<Bound<'py, PyDict>> {
    let refs = names
        .iter()
        .map(|n| reference("name", n))
        .collect::<Result<Vec<_>, _>>()?;
    let image = blocking(py, move || {
        let store = store(true)?.expect("created");
        Ok(store.import_as(&path, &refs)?)
    })?;
    image_dict(py, &image)
}

/// Every image in the store.
#[pyfunction]
fn images_list(py: Python<'_>) -> PyResult<Vec<Bound<'_, PyDict>>> {
    let images = blocking(py, || match store(false)? {
        Some(s) => Ok(s.list()?),
        None => Ok(Vec::new()),
    })?;
    images.iter().map(|i| image_dict(py, i)).collect()
}

/// Removes a name (or, by digest, every name of an image); returns `(refs removed, deleted)`.
#[pyfunction]
fn images_remove(py: Python<'_>, what: String) -> PyResult<(Vec<String>, bool)> {
    blocking(py, move || {
        let Some(s) = store(false)? else {
            return Err(Failure::new(
                crate::failure::Kind::ImageError,
                format!("no image {what:?} in the store"),
            ));
        };
        let r = s.remove(&what)?;
        Ok((r.refs, r.deleted))
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(images_pull, m)?)?;
    m.add_function(wrap_pyfunction!(images_import, m)?)?;
    m.add_function(wrap_pyfunction!(images_list, m)?)?;
    m.add_function(wrap_pyfunction!(images_remove, m)?)?;
    Ok(())
}
