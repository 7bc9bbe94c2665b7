//! The IREE runtime: a device, weights served as IREE parameters from
//! safetensors files, and sessions (one VM context each) holding the HAL,
//! `io_parameters` and one or more bytecode modules. eerie 0.7's high-level
//! runtime cannot register `io_parameters`, so this goes through the C API;
//! every native object is a newtype whose `Drop` releases it.
//!
//! None of these types is `Send`: IREE handles are used from one thread.

use std::collections::BTreeMap;
use std::{fmt, ptr::null_mut, rc::Rc};

use crate::{
    artifact::{Artifact, ParameterDecl},
    checkpoint::{Checkpoint, TensorEntry},
    error::{Error, Result},
    ffi::{self, check, string_view, sys},
    tensor::{DType, HostTensor, TensorDesc},
};

/// A HAL driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Driver {
    /// Runs work inline on the calling thread; lowest overhead on small calls.
    LocalSync,
    /// A task system with one worker per core.
    LocalTask,
    #[cfg(feature = "cuda")]
    Cuda,
    #[cfg(feature = "vulkan")]
    Vulkan,
}

impl Driver {
    pub fn name(self) -> &'static str {
        match self {
            Driver::LocalSync => "local-sync",
            Driver::LocalTask => "local-task",
            #[cfg(feature = "cuda")]
            Driver::Cuda => "cuda",
            #[cfg(feature = "vulkan")]
            Driver::Vulkan => "vulkan",
        }
    }
}

impl std::str::FromStr for Driver {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "local-sync" => Ok(Driver::LocalSync),
            "local-task" => Ok(Driver::LocalTask),
            #[cfg(feature = "cuda")]
            "cuda" => Ok(Driver::Cuda),
            #[cfg(feature = "vulkan")]
            "vulkan" => Ok(Driver::Vulkan),
            other => Err(Error::UnknownDriver(other.to_owned(), optional_drivers())),
        }
    }
}

fn optional_drivers() -> &'static str {
    match (cfg!(feature = "cuda"), cfg!(feature = "vulkan")) {
        (true, true) => ", cuda, vulkan",
        (true, false) => ", cuda",
        (false, true) => ", vulkan",
        (false, false) => " (cuda and vulkan are cargo features, off in this build)",
    }
}

struct DeviceInner {
    instance: *mut sys::iree_vm_instance_t,
    registry: *mut sys::iree_hal_driver_registry_t,
    driver: *mut sys::iree_hal_driver_t,
    device: *mut sys::iree_hal_device_t,
    group: *mut sys::iree_hal_device_group_t,
    kind: Driver,
    // Dropped after the fields above are released (Drop runs first).
    _lock: crate::lock::IreeLock,
}

impl Drop for DeviceInner {
    fn drop(&mut self) {
        // SAFETY: each pointer was created by `Device::new`, is released once,
        // here, in reverse order of creation; null ones were never created.
        unsafe {
            if !self.group.is_null() {
                sys::iree_hal_device_group_release(self.group);
            }
            if !self.device.is_null() {
                sys::iree_hal_device_release(self.device);
            }
            if !self.driver.is_null() {
                sys::iree_hal_driver_release(self.driver);
            }
            if !self.registry.is_null() {
                sys::iree_hal_driver_registry_free(self.registry);
            }
            if !self.instance.is_null() {
                sys::iree_vm_instance_release(self.instance);
            }
        }
    }
}

/// The process's one VM instance, with the HAL types registered once.
///
/// IREE keeps the registered HAL ref types in process-wide statics: a second
/// instance registering (or a dropped one unregistering) them while another
/// thread runs corrupted calls ("ref type mismatch" in
/// `hal.executable.lookup.function`) and once hung a test. Every device
/// therefore shares this instance, which lives for the whole process.
fn shared_instance() -> Result<*mut sys::iree_vm_instance_t> {
    struct Instance(*mut sys::iree_vm_instance_t);
    // SAFETY: an IREE VM instance is reference counted and internally
    // synchronised; it is only ever retained and used through the C API.
    unsafe impl Send for Instance {}
    // SAFETY: as above; shared references only read the pointer.
    unsafe impl Sync for Instance {}
    static INSTANCE: std::sync::OnceLock<Instance> = std::sync::OnceLock::new();
    static INIT: std::sync::Mutex<()> = std::sync::Mutex::new(());
    if let Some(i) = INSTANCE.get() {
        return Ok(i.0);
    }
    let _guard = INIT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(i) = INSTANCE.get() {
        return Ok(i.0);
    }
    let mut instance = null_mut();
    // SAFETY: creation into a local out-pointer; on a registration failure
    // the instance is released before returning.
    unsafe {
        check(
            sys::iree_vm_instance_create(sys::IREE_VM_TYPE_CAPACITY_DEFAULT as usize, ffi::allocator(), &mut instance),
            "creating the VM instance",
        )?;
        if let Err(e) = check(sys::iree_hal_module_register_all_types(instance), "registering HAL types") {
            sys::iree_vm_instance_release(instance);
            return Err(e);
        }
    }
    Ok(INSTANCE.get_or_init(|| Instance(instance)).0)
}

/// A VM instance and one HAL device. Cheap to clone (reference counted).
#[derive(Clone)]
pub struct Device {
    inner: Rc<DeviceInner>,
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device").field("driver", &self.inner.kind).finish()
    }
}

impl Device {
    /// Creates the VM instance and the driver's default device.
    pub fn new(kind: Driver) -> Result<Self> {
        let a = ffi::allocator();
        let mut inner = DeviceInner {
            instance: null_mut(),
            registry: null_mut(),
            driver: null_mut(),
            device: null_mut(),
            group: null_mut(),
            kind,
            _lock: crate::lock::IreeLock::acquire(),
        };
        // SAFETY: every out-pointer is a field of `inner`, whose Drop releases
        // whatever was created if a later step fails.
        unsafe {
            inner.instance = shared_instance()?;
            sys::iree_vm_instance_retain(inner.instance);
            check(sys::iree_hal_driver_registry_allocate(a, &mut inner.registry), "allocating the driver registry")?;
            check(sys::iree_hal_register_all_available_drivers(inner.registry), "registering HAL drivers")?;
            check(
                sys::iree_hal_driver_registry_try_create(
                    inner.registry,
                    string_view(kind.name()),
                    a,
                    &mut inner.driver,
                ),
                "creating the HAL driver",
            )?;
            let mut pool = null_mut();
            check(
                sys::iree_async_proactor_pool_create(
                    1,
                    std::ptr::null(),
                    sys::iree_async_proactor_pool_options_default(),
                    a,
                    &mut pool,
                ),
                "creating the proactor pool",
            )?;
            let params = sys::iree_hal_device_create_params_t { proactor_pool: pool, ..Default::default() };
            let created = sys::iree_hal_driver_create_default_device(inner.driver, &params, a, &mut inner.device);
            sys::iree_async_proactor_pool_release(pool);
            check(created, "creating the HAL device")?;
            let mut tracker = null_mut();
            check(
                sys::iree_async_frontier_tracker_create(
                    sys::iree_async_frontier_tracker_options_t {
                        axis_table_capacity: 256,
                        session_epoch: 1,
                        machine_index: 0,
                    },
                    a,
                    &mut tracker,
                ),
                "creating the frontier tracker",
            )?;
            let grouped = sys::iree_hal_device_group_create_from_device(inner.device, tracker, a, &mut inner.group);
            sys::iree_async_frontier_tracker_release(tracker);
            check(grouped, "creating the device group")?;
        }
        tracing::debug!(driver = kind.name(), "device created");
        Ok(Device { inner: Rc::new(inner) })
    }

    pub fn driver(&self) -> Driver {
        self.inner.kind
    }

    /// Copies a host tensor into a new device buffer.
    pub fn upload(&self, tensor: &HostTensor) -> Result<DeviceTensor> {
        let desc = tensor.desc().clone();
        let dims: Vec<sys::iree_hal_dim_t> = desc.shape.iter().map(|&d| d as sys::iree_hal_dim_t).collect();
        let mut view = null_mut();
        // SAFETY: `dims` and the tensor bytes outlive the call, which copies
        // them; their lengths match the descriptor (checked by HostTensor).
        unsafe {
            check(
                sys::iree_hal_buffer_view_allocate_buffer_copy(
                    self.inner.device,
                    sys::iree_hal_device_allocator(self.inner.device),
                    dims.len(),
                    dims.as_ptr(),
                    element_type(desc.dtype),
                    sys::iree_hal_encoding_types_t_IREE_HAL_ENCODING_TYPE_DENSE_ROW_MAJOR as _,
                    sys::iree_hal_buffer_params_t {
                        usage: sys::iree_hal_buffer_usage_bits_t_IREE_HAL_BUFFER_USAGE_DEFAULT as _,
                        access: sys::iree_hal_memory_access_bits_t_IREE_HAL_MEMORY_ACCESS_ALL as _,
                        type_: sys::iree_hal_memory_type_bits_t_IREE_HAL_MEMORY_TYPE_DEVICE_LOCAL as _,
                        queue_affinity: 0,
                        min_alignment: 0,
                    },
                    sys::iree_const_byte_span_t { data: tensor.bytes().as_ptr(), data_length: tensor.bytes().len() },
                    &mut view,
                ),
                "uploading a tensor",
            )?;
        }
        Ok(DeviceTensor { view, desc, device: self.clone() })
    }
}

/// The IREE element type of a dtype.
fn element_type(d: DType) -> sys::iree_hal_element_type_t {
    (match d {
        DType::F32 => sys::iree_hal_element_types_t_IREE_HAL_ELEMENT_TYPE_FLOAT_32,
        DType::F16 => sys::iree_hal_element_types_t_IREE_HAL_ELEMENT_TYPE_FLOAT_16,
        DType::BF16 => sys::iree_hal_element_types_t_IREE_HAL_ELEMENT_TYPE_BFLOAT_16,
        DType::I64 => sys::iree_hal_element_types_t_IREE_HAL_ELEMENT_TYPE_INT_64,
        DType::I32 => sys::iree_hal_element_types_t_IREE_HAL_ELEMENT_TYPE_INT_32,
        DType::I8 => sys::iree_hal_element_types_t_IREE_HAL_ELEMENT_TYPE_INT_8,
        DType::U8 => sys::iree_hal_element_types_t_IREE_HAL_ELEMENT_TYPE_UINT_8,
        DType::Bool => sys::iree_hal_element_types_t_IREE_HAL_ELEMENT_TYPE_BOOL_8,
    }) as sys::iree_hal_element_type_t
}

/// The dtype of an IREE element type. Signless integers are what the
/// compiler emits for MLIR `iN`, so they map like signed ones.
fn dtype_of(t: sys::iree_hal_element_type_t) -> Result<DType> {
    let all = [DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32, DType::I8, DType::U8, DType::Bool];
    if let Some(d) = all.into_iter().find(|&d| element_type(d) == t) {
        return Ok(d);
    }
    let signless = [
        (sys::iree_hal_element_types_t_IREE_HAL_ELEMENT_TYPE_SINT_64, DType::I64),
        (sys::iree_hal_element_types_t_IREE_HAL_ELEMENT_TYPE_SINT_32, DType::I32),
        (sys::iree_hal_element_types_t_IREE_HAL_ELEMENT_TYPE_SINT_8, DType::I8),
    ];
    signless
        .into_iter()
        .find(|&(e, _)| e as sys::iree_hal_element_type_t == t)
        .map(|(_, d)| d)
        .ok_or(Error::UnsupportedElementType(t))
}

/// A tensor in device memory (a retained HAL buffer view).
pub struct DeviceTensor {
    view: *mut sys::iree_hal_buffer_view_t,
    desc: TensorDesc,
    device: Device,
}

impl fmt::Debug for DeviceTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceTensor").field("desc", &self.desc).finish()
    }
}

impl Clone for DeviceTensor {
    fn clone(&self) -> Self {
        // SAFETY: `view` is live while `self` is; the clone holds its own reference.
        unsafe { sys::iree_hal_buffer_view_retain(self.view) };
        DeviceTensor { view: self.view, desc: self.desc.clone(), device: self.device.clone() }
    }
}

impl Drop for DeviceTensor {
    fn drop(&mut self) {
        // SAFETY: we hold one reference to `view`, released exactly once here.
        unsafe { sys::iree_hal_buffer_view_release(self.view) };
    }
}

impl DeviceTensor {
    /// Wraps a retained buffer view, reading its type from IREE.
    ///
    /// # Safety
    /// `view` must be a live buffer view whose reference passes to the result.
    unsafe fn from_retained(view: *mut sys::iree_hal_buffer_view_t, device: &Device) -> Result<Self> {
        // SAFETY: the caller guarantees `view` is live; the shape queries read
        // `rank` dims from it.
        let (etype, shape) = unsafe {
            let rank = sys::iree_hal_buffer_view_shape_rank(view);
            let shape = (0..rank).map(|i| sys::iree_hal_buffer_view_shape_dim(view, i) as usize).collect::<Vec<_>>();
            (sys::iree_hal_buffer_view_element_type(view), shape)
        };
        // Constructed first so the view is released if the dtype is unknown.
        let mut tensor = DeviceTensor { view, desc: TensorDesc::new(DType::U8, shape), device: device.clone() };
        tensor.desc.dtype = dtype_of(etype)?;
        Ok(tensor)
    }

    pub fn desc(&self) -> &TensorDesc {
        &self.desc
    }

    /// Copies the tensor to host memory.
    pub fn to_host(&self) -> Result<HostTensor> {
        let len = self.desc.byte_len("reading a device tensor")?;
        let mut bytes = vec![0u8; len];
        // SAFETY: `bytes` has exactly the view's byte length (dense row-major,
        // as the descriptor says); the transfer waits until it completes.
        unsafe {
            let buffer = sys::iree_hal_buffer_view_buffer(self.view);
            check(
                sys::iree_hal_device_transfer_d2h(
                    self.device.inner.device,
                    buffer,
                    0,
                    bytes.as_mut_ptr().cast(),
                    len as _,
                    sys::iree_hal_transfer_buffer_flag_bits_t_IREE_HAL_TRANSFER_BUFFER_FLAG_DEFAULT as _,
                    sys::iree_timeout_t { type_: sys::iree_timeout_type_e_IREE_TIMEOUT_ABSOLUTE, nanos: i64::MAX as _ },
                ),
                "reading a device tensor",
            )?;
        }
        HostTensor::from_bytes(self.desc.dtype, self.desc.shape.clone(), bytes)
    }
}

/// Weights served to modules by name: an IREE parameter index over a
/// checkpoint's safetensors files, under one scope (`model` by convention),
/// each tensor by its key and by any alias given (a graph's logical name for it).
pub struct Parameters {
    provider: *mut ffi::ParameterProvider,
    /// The provider's index (one reference of ours), to which tiled views are added.
    index: *mut ffi::ParameterIndex,
    scope: String,
    checkpoint: Checkpoint,
    /// Alias to checkpoint key.
    aliases: BTreeMap<String, String>,
    /// The tiled views built so far (their declared keys), each once per checkpoint.
    tiled: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

impl fmt::Debug for Parameters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Parameters")
            .field("scope", &self.scope)
            .field("files", &self.checkpoint.files())
            .field("tensors", &self.checkpoint.tensors().len())
            .finish()
    }
}

impl Drop for Parameters {
    fn drop(&mut self) {
        // SAFETY: we own one reference to the provider and one to the index,
        // each released once here.
        unsafe {
            ffi::iree_io_parameter_provider_release(self.provider);
            ffi::iree_io_parameter_index_release(self.index);
        }
    }
}

impl Parameters {
    /// Indexes the (already validated) checkpoint's files (see
    /// `index_files`: aligned files are mapped and served without a copy).
    pub fn new(scope: &str, checkpoint: Checkpoint) -> Result<Self> {
        Self::with_aliases(scope, checkpoint, BTreeMap::new())
    }

    /// As [`Parameters::new`], each `alias -> key` pair also serving the checkpoint tensor
    /// `key` as `alias` (the same bytes, not a copy). Every key must be in the checkpoint,
    /// and no alias may be a key of another tensor.
    pub fn with_aliases(scope: &str, checkpoint: Checkpoint, aliases: BTreeMap<String, String>) -> Result<Self> {
        for (alias, key) in &aliases {
            if checkpoint.get(key).is_none() {
                return Err(Error::ParameterMissing { key: key.clone(), files: checkpoint.describe_files() });
            }
            if alias != key && checkpoint.get(alias).is_some() {
                return Err(Error::ParameterAlias { alias: alias.clone(), key: key.clone() });
            }
        }
        let a = ffi::allocator();
        let mut index = null_mut();
        // SAFETY: the index is released on every path after the provider
        // (which retains it) is created or creation fails.
        unsafe {
            check(ffi::iree_io_parameter_index_create(a, &mut index), "creating a parameter index")?;
            let indexed = index_files(index, &checkpoint).and_then(|()| {
                aliases.iter().filter(|(alias, key)| alias != key).try_for_each(|(alias, key)| {
                    check(
                        ffi::mlxcel_parameter_index_alias(index, string_view(key), string_view(alias)),
                        "adding a parameter alias",
                    )
                })
            });
            let mut provider = null_mut();
            let created = indexed.and_then(|()| {
                check(
                    ffi::iree_io_parameter_index_provider_create(string_view(scope), index, 16, a, &mut provider),
                    "creating the parameter provider",
                )
            });
            if let Err(e) = created {
                ffi::iree_io_parameter_index_release(index);
                return Err(e);
            }
            Ok(Parameters { provider, index, scope: scope.to_owned(), checkpoint, aliases, tiled: Default::default() })
        }
    }

    pub fn checkpoint(&self) -> &Checkpoint {
        &self.checkpoint
    }

    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// Checks that every parameter a module declares is in the checkpoint
    /// with the declared type, so a mismatch is named before IREE loads it.
    pub fn check_module(&self, decls: &[ParameterDecl]) -> Result<()> {
        for decl in decls {
            if decl.scope != self.scope {
                return Err(Error::ParameterScope { scope: decl.scope.clone(), provided: self.scope.clone() });
            }
            if let Some((stored, tile)) = tiled_view(&decl.key) {
                self.add_tiled(decl, stored, tile)?;
                continue;
            }
            let (_, entry) = self.stored(&decl.key)?;
            let mismatch = |wanted: String| mismatch(decl, entry, wanted);
            let packed = packed_bits(&decl.ty).filter(|&bits| bits == 4 || entry.dtype == "U32");
            if let Some(bits) = packed {
                // MLX's quantized weights: `uint32` words read as 8 four-bit or 4 eight-bit
                // integers each, least significant first (IREE's packing of the same bytes).
                if !packs(&decl.ty, bits, &entry.dtype, &entry.shape) {
                    return Err(mismatch(format!("{} (u32 words packing {bits}-bit integers)", decl.ty)));
                }
            } else if let Some(want) = &decl.desc {
                if entry.desc().as_ref() != Some(want) {
                    return Err(mismatch(want.to_string()));
                }
            } else if !decl.ty.is_empty() {
                return Err(mismatch(format!("{} (a type the host cannot check)", decl.ty)));
            }
        }
        Ok(())
    }
}

impl Parameters {
    /// The checkpoint key and tensor serving the declared name `name` (through its alias, if
    /// it has one).
    fn stored<'a>(&'a self, name: &'a str) -> Result<(&'a str, &'a TensorEntry)> {
        let key = self.aliases.get(name).map(String::as_str).unwrap_or(name);
        let entry = self
            .checkpoint
            .get(key)
            .ok_or_else(|| Error::ParameterMissing { key: name.to_owned(), files: self.checkpoint.describe_files() })?;
        Ok((key, entry))
    }

    /// Serves `decl`, the tiled view of the stored `[out, in]` matrix `stored` that a module
    /// declares (`[out / rows, in / depth, rows, depth]`, row `r` input `i` at `[r / rows, i /
    /// depth, r % rows, i % depth]`), building it the first time: the stored bytes are read (not
    /// mapped, so they stay out of the resident set), reordered into memory of their own, and that
    /// memory added to the index under the declared key. Later modules declaring the same view
    /// share it.
    fn add_tiled(&self, decl: &ParameterDecl, stored: &str, tile: Tile) -> Result<()> {
        let (key, entry) = self.stored(stored)?;
        let Tile { rows, depth } = tile;
        // MLX's packed integers (`uint32` words of 8 four-bit or 4 eight-bit values, least
        // significant first) declared as `i4`/`i8` tiles: the integers of `[out, in]`, tiled.
        let packed = packed_bits(&decl.ty).filter(|_| entry.dtype == "U32");
        let tiled = match (packed, entry.desc(), entry.shape.as_slice()) {
            (Some(bits), _, &[out, words]) => {
                let inputs = words * 32 / bits;
                let want = format!("tensor<{}x{}x{rows}x{depth}xi{bits}>", out / rows.max(1), inputs / depth.max(1));
                (out.is_multiple_of(rows) && inputs.is_multiple_of(depth) && (bits == 8 || rows.is_multiple_of(2)))
                    .then_some((bits, out, inputs))
                    .filter(|_| decl.ty.trim() == want)
            }
            (None, Some(desc), &[out, inputs])
                if out.is_multiple_of(rows) && inputs.is_multiple_of(depth) && desc.dtype.size() > 0 =>
            {
                let want = TensorDesc::new(desc.dtype, vec![out / rows, inputs / depth, rows, depth]);
                (decl.desc.as_ref() == Some(&want)).then_some((8 * desc.dtype.size(), out, inputs))
            }
            _ => None,
        };
        let Some((bits, out, inputs)) = tiled else {
            let wanted = format!("{} (an [out, in] matrix whose rows fill tiles of {rows} by {depth} inputs)", decl.ty);
            return Err(mismatch(decl, entry, wanted));
        };
        let mut built = self.tiled.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if built.contains(&decl.key) {
            return Ok(());
        }
        let bytes = self.checkpoint.read(key)?;
        let mut host = HostBytes::new(bytes.len()).ok_or_else(|| Error::Iree {
            operation: "tiling a weight",
            message: format!("could not allocate {} bytes for {}", bytes.len(), decl.key),
        })?;
        match bits {
            // Two integers a byte: the words' bytes in order hold the row's integers in order,
            // low nibble first, as IREE packs `i4`.
            4 => tile_nibbles(&bytes, host.as_mut_slice(), out, inputs, tile),
            _ => tile_rows(&bytes, host.as_mut_slice(), out, inputs, tile, bits / 8),
        }
        drop(bytes);
        let len = host.len;
        let host = Box::into_raw(Box::new(host));
        // SAFETY: `host` is ours until the handle owns it through `release`, which IREE calls
        // once, when the last reference to the handle goes; on failure to wrap it is freed here.
        unsafe {
            let handle = match wrap_host_memory(
                (*host).ptr.cast(),
                len,
                free_host_bytes,
                host.cast(),
                "wrapping a tiled weight",
            ) {
                Ok(handle) => handle,
                Err(e) => {
                    drop(Box::from_raw(host));
                    return Err(e);
                }
            };
            let added = check(
                ffi::mlxcel_parameter_index_add_handle(self.index, string_view(&decl.key), handle, len as u64),
                "adding a tiled weight",
            );
            // The index holds its own reference once the entry is added.
            sys::iree_io_file_handle_release(handle);
            added?;
        }
        tracing::debug!(key = %decl.key, bytes = len, "weight tiled");
        built.insert(decl.key.clone());
        Ok(())
    }
}

/// `decl` is not what the checkpoint tensor `entry` holds.
fn mismatch(decl: &ParameterDecl, entry: &TensorEntry, wanted: String) -> Error {
    Error::ParameterMismatch { key: decl.key.clone(), found: format!("{} {:?}", entry.dtype, entry.shape), wanted }
}

/// The tiles of a tiled view: `rows` rows by `depth` consecutive inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tile {
    rows: usize,
    depth: usize,
}

/// A declared key naming a checkpoint matrix served in tiles, `{key}|tile{rows}` or
/// `{key}|tile{rows}x{depth}` (as the graphs' numeric contract spells it): the stored key and
/// the tiles.
fn tiled_view(key: &str) -> Option<(&str, Tile)> {
    let (stored, tile) = key.rsplit_once("|tile")?;
    let (rows, depth) = tile.split_once('x').unwrap_or((tile, "1"));
    let positive = |s: &str| s.parse::<usize>().ok().filter(|&n| n > 0);
    Some((stored, Tile { rows: positive(rows)?, depth: positive(depth)? }))
}

/// Reorders a row-major `[out, inputs]` matrix of `elem`-byte values into `[out / rows,
/// inputs / depth, rows, depth]`: each tile of `rows` consecutive rows stored `depth` inputs
/// at a time.
fn tile_rows(src: &[u8], dst: &mut [u8], out: usize, inputs: usize, tile: Tile, elem: usize) {
    debug_assert_eq!(src.len(), out * inputs * elem);
    match elem {
        1 => tile_all::<1>(src, dst, inputs, tile),
        2 => tile_all::<2>(src, dst, inputs, tile),
        4 => tile_all::<4>(src, dst, inputs, tile),
        _ => {
            let bytes = tile.rows * inputs * elem;
            for (t, dst) in dst.chunks_exact_mut(bytes).enumerate() {
                let src = &src[t * bytes..][..bytes];
                for (i, v) in dst.chunks_exact_mut(elem).enumerate() {
                    let (k, r, d) = (i / (tile.rows * tile.depth), i / tile.depth % tile.rows, i % tile.depth);
                    v.copy_from_slice(&src[(r * inputs + k * tile.depth + d) * elem..][..elem]);
                }
            }
        }
    }
}

/// [`tile_rows`] for 4-bit integers packed two a byte, low nibble first (the row-major
/// `[out, inputs]` matrix, and its tiles, as IREE stores `i4`), on two threads: tiles one input
/// deep of an even number of rows, so each byte of a tile holds two rows' integers of one input.
fn tile_nibbles(src: &[u8], dst: &mut [u8], out: usize, inputs: usize, tile: Tile) {
    debug_assert!(tile.depth == 1 && tile.rows.is_multiple_of(2) && inputs.is_multiple_of(2));
    debug_assert_eq!(src.len(), out * inputs / 2);
    let rows = tile.rows;
    let (row_bytes, tile_bytes) = (inputs / 2, rows * inputs / 2);
    let one = |(t, dst): (usize, &mut [u8])| {
        let src = &src[t * tile_bytes..][..tile_bytes];
        for (i, column) in dst.chunks_exact_mut(rows / 2).enumerate() {
            let (at, shift) = (i / 2, 4 * (i % 2));
            for (j, byte) in column.iter_mut().enumerate() {
                let lo = (src[2 * j * row_bytes + at] >> shift) & 0x0f;
                let hi = (src[(2 * j + 1) * row_bytes + at] >> shift) & 0x0f;
                *byte = lo | (hi << 4);
            }
        }
    };
    let half = (out / rows).div_ceil(2);
    let (first, rest) = dst.split_at_mut(half * tile_bytes);
    std::thread::scope(|s| {
        s.spawn(|| first.chunks_exact_mut(tile_bytes).enumerate().for_each(one));
        rest.chunks_exact_mut(tile_bytes).enumerate().map(|(i, d)| (i + half, d)).for_each(one);
    });
}

/// [`tile_rows`] for `E`-byte values, on two threads: a decoder's weights are gigabytes and
/// loading waits for them. The destination is written in order; each source row is read along
/// its cache lines, `rows` rows at a time.
fn tile_all<const E: usize>(src: &[u8], dst: &mut [u8], inputs: usize, tile: Tile) {
    let Tile { rows, depth } = tile;
    let bytes = rows * inputs * E;
    let one = |(t, dst): (usize, &mut [u8])| {
        let src = &src[t * bytes..][..bytes];
        for (k, column) in dst.chunks_exact_mut(rows * depth * E).enumerate() {
            for (r, run) in column.chunks_exact_mut(depth * E).enumerate() {
                let at = (r * inputs + k * depth) * E;
                run.copy_from_slice(&src[at..at + depth * E]);
            }
        }
    };
    let half = (dst.len() / bytes.max(1)).div_ceil(2);
    let (first, rest) = dst.split_at_mut(half * bytes);
    std::thread::scope(|s| {
        s.spawn(|| first.chunks_exact_mut(bytes).enumerate().for_each(one));
        rest.chunks_exact_mut(bytes).enumerate().map(|(i, d)| (i + half, d)).for_each(one);
    });
}

/// Host memory at IREE's heap buffer alignment, owned by a file handle once wrapped.
struct HostBytes {
    ptr: *mut u8,
    len: usize,
}

impl HostBytes {
    fn layout(len: usize) -> Option<std::alloc::Layout> {
        std::alloc::Layout::from_size_align(len.max(1), HEAP_BUFFER_ALIGNMENT as usize).ok()
    }

    fn new(len: usize) -> Option<Self> {
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc(Self::layout(len)?) };
        (!ptr.is_null()).then_some(HostBytes { ptr, len })
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` holds `len` bytes we own (uninitialised bytes are written before any read:
        // `tile_rows` writes every byte of the destination).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for HostBytes {
    fn drop(&mut self) {
        if let Some(layout) = Self::layout(self.len) {
            // SAFETY: allocated in `new` with this layout, freed once.
            unsafe { std::alloc::dealloc(self.ptr, layout) };
        }
    }
}

/// The release callback of a tiled weight's handle.
unsafe extern "C" fn free_host_bytes(
    user_data: *mut std::ffi::c_void,
    _primitive: sys::iree_io_file_handle_primitive_t,
) {
    // SAFETY: `user_data` is the `HostBytes` `add_tiled` leaked for this handle, released once.
    drop(unsafe { Box::from_raw(user_data.cast::<HostBytes>()) });
}

/// The bits per element of a declared `tensor<...xi4>` or `tensor<...xi8>`, the types a
/// module reads packed quantized weights as; `None` for any other type.
fn packed_bits(ty: &str) -> Option<usize> {
    let elem = ty.strip_suffix('>')?.rsplit('x').next()?;
    match elem {
        "i4" => Some(4),
        "i8" => Some(8),
        _ => None,
    }
}

/// Whether a checkpoint tensor of `dtype` and `shape` holds exactly the declared packed `ty`:
/// `U32`, the same leading dimensions, and as many bits in the last.
fn packs(ty: &str, bits: usize, dtype: &str, shape: &[usize]) -> bool {
    let Some(inner) = ty.trim().strip_prefix("tensor<").and_then(|t| t.strip_suffix('>')) else { return false };
    let mut dims: Vec<&str> = inner.split('x').collect();
    dims.pop();
    let Some(want) = dims.iter().map(|d| d.parse::<usize>().ok()).collect::<Option<Vec<usize>>>() else {
        return false;
    };
    match (want.split_last(), shape.split_last()) {
        (Some((w_last, w_lead)), Some((f_last, f_lead))) => {
            dtype == "U32" && w_lead == f_lead && w_last * bits == f_last * 32
        }
        _ => false,
    }
}

/// IREE's heap buffers must start at a multiple of this (`IREE_HAL_HEAP_BUFFER_ALIGNMENT`).
const HEAP_BUFFER_ALIGNMENT: u64 = 64;

/// Adds every file of `checkpoint` to `index`. A file whose every tensor is
/// aligned as IREE's heap buffers must be is given as a read-only memory
/// mapping, which IREE imports as the parameters' buffers with no copy. Any
/// other file is opened (`iree_io_file_handle_open`) and IREE copies its
/// tensors into its own memory at load: mapping it would only add the mapped
/// pages it copies from to the process's resident set. safetensors aligns
/// tensors to 8 bytes, so which files qualify depends on the header length.
///
/// # Safety
/// `index` must be a live parameter index.
unsafe fn index_files(index: *mut ffi::ParameterIndex, checkpoint: &Checkpoint) -> Result<()> {
    let a = ffi::allocator();
    let mut mapped = 0;
    for (i, path) in checkpoint.files().iter().enumerate() {
        let name = path.to_string_lossy();
        let handle = if checkpoint.file_aligned(i, HEAP_BUFFER_ALIGNMENT) {
            mapped += 1;
            map_file(path)?
        } else {
            open_file(&name)?
        };
        // SAFETY: `name` outlives the call; the index retains the handle it
        // needs, so ours is released right after parsing.
        unsafe {
            let parsed = ffi::iree_io_parse_file_index(string_view(&name), handle, index, a);
            sys::iree_io_file_handle_release(handle);
            check(parsed, "indexing a checkpoint file")?;
        }
    }
    // SAFETY: `index` is live (caller's contract).
    let count = unsafe { ffi::iree_io_parameter_index_count(index) };
    tracing::debug!(files = checkpoint.files().len(), mapped, tensors = count, "parameters indexed");
    Ok(())
}

/// Opens `path` as an IREE file handle that IREE reads from (one reference,
/// the caller's).
fn open_file(path: &str) -> Result<*mut sys::iree_io_file_handle_t> {
    let mut handle = null_mut();
    let mode = sys::iree_io_file_mode_bits_t_IREE_IO_FILE_MODE_READ
        | sys::iree_io_file_mode_bits_t_IREE_IO_FILE_MODE_RANDOM_ACCESS;
    // SAFETY: `path` outlives the call; on success we own the one reference.
    unsafe {
        check(
            sys::iree_io_file_handle_open(mode as _, string_view(path), ffi::allocator(), &mut handle),
            "opening a checkpoint file",
        )?;
    }
    Ok(handle)
}

/// A mapping IREE owns through a file handle; unmapped by [`unmap`] when the
/// last reference to the handle (the index's, or an imported buffer's) goes.
struct Mapping {
    ptr: *mut std::ffi::c_void,
    len: usize,
}

/// Maps `path` read-only and wraps the mapping as an IREE host-allocation
/// file handle (one reference, the caller's). IREE 3.13 imports each aligned
/// tensor as a buffer starting at the tensor but declared as long as the whole
/// file (`parameter_index_provider.c`); modules only read the tensor's own
/// bytes, so nothing reads past the mapping.
fn map_file(path: &std::path::Path) -> Result<*mut sys::iree_io_file_handle_t> {
    use std::os::fd::AsRawFd;
    let failed = |source: std::io::Error| Error::CheckpointIo { path: path.to_owned(), source };
    let file = std::fs::File::open(path).map_err(failed)?;
    let len = file.metadata().map_err(failed)?.len() as usize;
    if len == 0 {
        let empty = std::io::Error::new(std::io::ErrorKind::InvalidData, "the file is empty");
        return Err(failed(empty));
    }
    // SAFETY: a fresh read-only private mapping of a file we opened; the
    // file may be closed once mapped. Checkpoint files are not modified
    // while served (a changed file changes the fingerprint on next load).
    let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_PRIVATE, file.as_raw_fd(), 0) };
    if ptr == libc::MAP_FAILED {
        return Err(failed(std::io::Error::last_os_error()));
    }
    let mapping = Box::into_raw(Box::new(Mapping { ptr, len }));
    // SAFETY: on success the handle owns `mapping` through `unmap`; on
    // failure IREE does not call it, so the mapping is undone here.
    unsafe {
        wrap_host_memory(ptr.cast(), len, unmap, mapping.cast(), "wrapping a mapped checkpoint file").inspect_err(
            |_| {
                // SAFETY: the handle was not created, so nothing else owns `mapping`.
                unmap(mapping.cast(), std::mem::zeroed())
            },
        )
    }
}

/// Wraps the `len` bytes at `data` as a read-only IREE file handle (one reference, the
/// caller's) whose last release calls `release(user_data)`. On failure IREE does not call it,
/// and `user_data` is still the caller's.
///
/// # Safety
/// The bytes must stay valid until `release` is called.
unsafe fn wrap_host_memory(
    data: *mut u8,
    len: usize,
    release: unsafe extern "C" fn(*mut std::ffi::c_void, sys::iree_io_file_handle_primitive_t),
    user_data: *mut std::ffi::c_void,
    what: &'static str,
) -> Result<*mut sys::iree_io_file_handle_t> {
    let span = sys::iree_byte_span_t { data, data_length: len };
    let release = sys::iree_io_file_handle_release_callback_t { fn_: Some(release), user_data };
    let mut handle = null_mut();
    // SAFETY: the bytes outlive the handle (the caller's contract).
    let status = unsafe {
        sys::iree_io_file_handle_wrap_host_allocation(
            sys::iree_io_file_access_bits_t_IREE_IO_FILE_ACCESS_READ,
            span,
            release,
            ffi::allocator(),
            &mut handle,
        )
    };
    check(status, what)?;
    Ok(handle)
}

/// The release callback of a mapped file's handle.
unsafe extern "C" fn unmap(user_data: *mut std::ffi::c_void, _primitive: sys::iree_io_file_handle_primitive_t) {
    // SAFETY: `user_data` is the `Mapping` `map_file` leaked for this handle,
    // released exactly once, here.
    let mapping = unsafe { Box::from_raw(user_data.cast::<Mapping>()) };
    // SAFETY: the range is the mapping `map_file` made; nothing reads it now.
    unsafe { libc::munmap(mapping.ptr, mapping.len) };
}

/// How a function's argument is declared in its ABI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArgSpec {
    /// A tensor; `None` dims are dynamic.
    Tensor { dtype: DType, dims: Vec<Option<usize>> },
    /// Anything else (the shim passes only tensors).
    Other(String),
}

impl ArgSpec {
    fn parse(ty: &str) -> ArgSpec {
        let parsed = (|| {
            let inner = ty.strip_prefix("tensor<")?.strip_suffix('>')?;
            let mut parts: Vec<&str> = inner.split('x').collect();
            let dtype = DType::from_mlir(parts.pop()?)?;
            let dims = parts.iter().map(|p| if *p == "?" { Some(None) } else { p.parse().ok().map(Some) });
            Some(ArgSpec::Tensor { dtype, dims: dims.collect::<Option<Vec<_>>>()? })
        })();
        parsed.unwrap_or_else(|| ArgSpec::Other(ty.to_owned()))
    }

    fn check(&self, got: &TensorDesc, context: &str) -> Result<()> {
        let ArgSpec::Tensor { dtype, dims } = self else {
            return Err(Error::Iree {
                operation: "argument check",
                message: format!("{context} is declared as {self:?}; only tensors can be passed"),
            });
        };
        if got.dtype != *dtype {
            return Err(Error::DTypeMismatch { context: context.to_owned(), got: got.dtype, want: *dtype });
        }
        if got.shape.len() != dims.len() {
            return Err(Error::RankMismatch { context: context.to_owned(), got: got.shape.len(), want: dims.len() });
        }
        if got.shape.iter().zip(dims).any(|(g, w)| w.is_some_and(|w| w != *g)) {
            return Err(Error::ShapeMismatch {
                context: context.to_owned(),
                got: got.shape.clone(),
                want: dims.iter().map(|d| d.unwrap_or(0)).collect(),
            });
        }
        Ok(())
    }
}

/// An exported function and its declared arguments.
#[derive(Clone, Debug)]
pub struct FunctionInfo {
    /// `module.function`.
    pub name: String,
    /// Declared arguments, when the module carries ABI reflection.
    pub args: Option<Vec<ArgSpec>>,
    /// Compiled with IREE's asynchronous ABI (`iree.abi.model` is
    /// `coarse-fences`): it takes a wait and a signal fence after its
    /// arguments, which [`Session::start`] appends.
    pub asynchronous: bool,
    function: sys::iree_vm_function_t,
}

/// Reads the arguments out of an `iree.abi.declaration` such as
/// `sync func @f(%input0: tensor<4xf32>, %input1: tensor<i32>) -> (...)`.
fn parse_declaration(decl: &str) -> Option<Vec<ArgSpec>> {
    let open = decl.find('(')?;
    let mut depth = 0usize;
    let mut end = None;
    for (i, c) in decl[open..].char_indices() {
        match c {
            '(' | '<' => depth += 1,
            ')' | '>' => {
                depth -= 1;
                if depth == 0 && c == ')' {
                    end = Some(open + i);
                    break;
                }
            }
            _ => {}
        }
    }
    let inner = &decl[open + 1..end?];
    if inner.trim().is_empty() {
        return Some(Vec::new());
    }
    // Split on top-level commas.
    let (mut args, mut depth, mut start) = (Vec::new(), 0usize, 0usize);
    for (i, c) in inner.char_indices() {
        match c {
            '<' | '(' | '{' | '[' => depth += 1,
            '>' | ')' | '}' | ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                args.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    args.push(&inner[start..]);
    Some(
        args.iter()
            .map(|a| {
                let ty = a.split_once(':').map_or(*a, |(_, t)| t).trim();
                // Drop trailing attribute dictionaries, e.g. `{iree.abi.output = 0}`.
                let ty = ty.split(" {").next().unwrap_or(ty).trim();
                ArgSpec::parse(ty)
            })
            .collect(),
    )
}

/// One of the tensors passed to a call.
#[derive(Debug)]
pub enum Arg<'a> {
    /// Uploaded for this call.
    Host(&'a HostTensor),
    /// Already on the device; passed by reference, no copy.
    Device(&'a DeviceTensor),
}

impl<'a> From<&'a HostTensor> for Arg<'a> {
    fn from(t: &'a HostTensor) -> Self {
        Arg::Host(t)
    }
}

impl<'a> From<&'a DeviceTensor> for Arg<'a> {
    fn from(t: &'a DeviceTensor) -> Self {
        Arg::Device(t)
    }
}

/// A VM variant list, released on drop.
struct VmList(*mut sys::iree_vm_list_t);

impl VmList {
    fn new(capacity: usize) -> Result<Self> {
        let mut list = null_mut();
        // SAFETY: plain creation into a local out-pointer.
        unsafe {
            check(
                sys::iree_vm_list_create(sys::iree_vm_type_def_t::default(), capacity, ffi::allocator(), &mut list),
                "creating a VM list",
            )?;
        }
        Ok(VmList(list))
    }
}

impl Drop for VmList {
    fn drop(&mut self) {
        // SAFETY: we own the list's only reference.
        unsafe { sys::iree_vm_list_release(self.0) };
    }
}

/// A loaded module: the bytecode module and the VMFB bytes it points into.
struct LoadedModule {
    module: *mut sys::iree_vm_module_t,
    // The bytecode module references these bytes without copying them, so
    // they are dropped only after the module and the context are released.
    _vmfb: Box<[u8]>,
}

/// One VM context: the HAL module, the `io_parameters` module (when weights
/// are given) and the bytecode modules, sharing their globals (for example a
/// device-resident KV cache) across calls.
pub struct Session {
    context: *mut sys::iree_vm_context_t,
    device: Device,
    functions: Vec<FunctionInfo>,
    system_modules: Vec<*mut sys::iree_vm_module_t>,
    modules: Vec<LoadedModule>,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("device", &self.device)
            .field("functions", &self.functions.iter().map(|f| &f.name).collect::<Vec<_>>())
            .finish()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // SAFETY: the context is released first (it retains the modules),
        // then our own module references, then the VMFB bytes (field drop).
        unsafe {
            if !self.context.is_null() {
                sys::iree_vm_context_release(self.context);
            }
            for m in &self.modules {
                sys::iree_vm_module_release(m.module);
            }
            for &m in &self.system_modules {
                sys::iree_vm_module_release(m);
            }
        }
    }
}

impl Session {
    /// Creates a context holding `artifacts` (in order; later modules may
    /// import earlier ones), with `parameters` serving their weights.
    /// Parameter declarations are checked against the checkpoint first.
    /// Loading is atomic: on any error nothing stays loaded.
    pub fn new(device: &Device, parameters: Option<&Parameters>, artifacts: &[&Artifact]) -> Result<Self> {
        for artifact in artifacts {
            match parameters {
                Some(p) => p.check_module(&artifact.meta.parameters)?,
                None => {
                    if let Some(decl) = artifact.meta.parameters.first() {
                        return Err(Error::ParameterScope { scope: decl.scope.clone(), provided: "none".into() });
                    }
                }
            }
        }
        let a = ffi::allocator();
        let instance = device.inner.instance;
        let mut session = Session {
            context: null_mut(),
            device: device.clone(),
            functions: Vec::new(),
            system_modules: Vec::new(),
            modules: Vec::new(),
        };
        // SAFETY: every created object is pushed into `session` right away,
        // so its Drop releases it if a later step fails.
        unsafe {
            let mut hal = null_mut();
            check(
                sys::iree_hal_module_create(
                    instance,
                    sys::iree_hal_module_device_policy_default(),
                    device.inner.group,
                    sys::iree_hal_module_flag_bits_t_IREE_HAL_MODULE_FLAG_SYNCHRONOUS as _,
                    sys::iree_hal_module_debug_sink_null(),
                    a,
                    &mut hal,
                ),
                "creating the HAL module",
            )?;
            session.system_modules.push(hal);
            if let Some(p) = parameters {
                let mut io = null_mut();
                check(
                    ffi::iree_io_parameters_module_create(instance, 1, &p.provider, a, &mut io),
                    "creating the io_parameters module",
                )?;
                session.system_modules.push(io);
            }
            for artifact in artifacts {
                let vmfb: Box<[u8]> = artifact.vmfb.clone().into_boxed_slice();
                let mut module = null_mut();
                check(
                    sys::iree_vm_bytecode_module_create(
                        instance,
                        sys::iree_vm_bytecode_module_flags_e_IREE_VM_BYTECODE_MODULE_FLAG_NONE,
                        sys::iree_const_byte_span_t { data: vmfb.as_ptr(), data_length: vmfb.len() },
                        // A null allocator: IREE never frees these bytes; we do.
                        sys::iree_allocator_t { self_: null_mut(), ctl: None },
                        a,
                        &mut module,
                    ),
                    "loading a compiled module",
                )
                .map_err(|e| name_error(e, &artifact.meta.name))?;
                session.modules.push(LoadedModule { module, _vmfb: vmfb });
            }
            let mut all: Vec<*mut sys::iree_vm_module_t> = session.system_modules.clone();
            all.extend(session.modules.iter().map(|m| m.module));
            let started = std::time::Instant::now();
            // Context creation runs module initialisers, which load parameters.
            check(
                sys::iree_vm_context_create_with_modules(
                    instance,
                    sys::iree_vm_context_flag_bits_t_IREE_VM_CONTEXT_FLAG_NONE as _,
                    all.len(),
                    all.as_mut_ptr(),
                    a,
                    &mut session.context,
                ),
                "creating the VM context (this loads parameters)",
            )?;
            tracing::debug!(elapsed_ms = started.elapsed().as_millis() as u64, "context created");
            for m in &session.modules {
                session.functions.extend(exported_functions(m.module)?);
            }
        }
        Ok(session)
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Every exported function, as `module.function`.
    pub fn functions(&self) -> &[FunctionInfo] {
        &self.functions
    }

    /// Looks up an exported function by `module.function` name.
    pub fn function(&self, name: &str) -> Result<&FunctionInfo> {
        self.functions.iter().find(|f| f.name == name).ok_or_else(|| Error::FunctionNotFound {
            name: name.to_owned(),
            exported: self.functions.iter().map(|f| f.name.as_str()).collect::<Vec<_>>().join(", "),
        })
    }

    /// Calls `name` with tensor arguments and returns its tensor results,
    /// once the device has computed them.
    /// Arguments are checked against the declared signature before the call.
    /// A device tensor passed to a function that updates it in place is
    /// consumed: IREE may write through it.
    pub fn call(&self, name: &str, args: &[Arg<'_>]) -> Result<Vec<DeviceTensor>> {
        self.start(name, args)?.finish()
    }

    /// Starts `name` and returns without waiting for the device when the
    /// function was compiled with IREE's asynchronous ABI (`coarse-fences`,
    /// `--iree-execution-model=async-external`): the device's own workers
    /// run it while the caller goes on, and the returned [`Invocation`]
    /// says when it is done. A synchronous function has run when this
    /// returns. Arguments are checked as [`Session::call`] checks them.
    pub fn start(&self, name: &str, args: &[Arg<'_>]) -> Result<Invocation> {
        let f = self.function(name)?;
        if let Some(specs) = &f.args {
            if specs.len() != args.len() {
                return Err(Error::ArgumentCount { function: name.to_owned(), expected: specs.len(), got: args.len() });
            }
            for (i, (spec, arg)) in specs.iter().zip(args).enumerate() {
                let desc = match arg {
                    Arg::Host(t) => t.desc(),
                    Arg::Device(t) => t.desc(),
                };
                spec.check(desc, &format!("{name} argument {i}"))?;
            }
        }
        // Uploads happen before any list work so a failure leaks nothing.
        let uploaded: Vec<DeviceTensor> = args
            .iter()
            .filter_map(|a| match a {
                Arg::Host(t) => Some(self.device.upload(t)),
                Arg::Device(_) => None,
            })
            .collect::<Result<_>>()?;
        let mut uploaded = uploaded.iter();
        let inputs = VmList::new(args.len() + 2)?;
        for arg in args {
            let t = match arg {
                Arg::Host(_) => uploaded.next().expect("invariant: one upload per host argument"),
                Arg::Device(t) => t,
            };
            // SAFETY: `t.view` is live; the list takes its own reference.
            unsafe {
                let mut r = sys::iree_hal_buffer_view_retain_ref(t.view);
                check(sys::iree_vm_list_push_ref_move(inputs.0, &mut r), "passing an argument")?;
            }
        }
        let signal = if f.asynchronous { Some(self.append_fences(&inputs)?) } else { None };
        let outputs = VmList::new(4)?;
        // SAFETY: the context, function and both lists are live for the call.
        unsafe {
            check(
                sys::iree_vm_invoke(
                    self.context,
                    f.function,
                    sys::iree_vm_invocation_flag_bits_t_IREE_VM_INVOCATION_FLAG_NONE as _,
                    std::ptr::null(),
                    inputs.0,
                    outputs.0,
                    ffi::allocator(),
                ),
                "running a function",
            )
            .map_err(|e| name_error(e, name))?;
        }
        Ok(Invocation { name: name.to_owned(), outputs, signal, device: self.device.clone() })
    }

    /// Appends the asynchronous ABI's two fences to `inputs`: none to wait
    /// for (the arguments are ready), and a new one the device signals when
    /// the results are. Returns the signal fence.
    fn append_fences(&self, inputs: &VmList) -> Result<Fence> {
        let mut semaphore = null_mut();
        let mut fence = Fence(null_mut());
        // SAFETY: creation into local out-pointers; the semaphore reference we
        // hold is released once the fence retains it; each list push takes
        // its own reference (a null ref for "nothing to wait for").
        unsafe {
            check(
                sys::iree_hal_semaphore_create(
                    self.device.inner.device,
                    u64::MAX, // IREE_HAL_QUEUE_AFFINITY_ANY
                    0,
                    sys::iree_hal_semaphore_flag_bits_t_IREE_HAL_SEMAPHORE_FLAG_DEFAULT as _,
                    &mut semaphore,
                ),
                "creating a semaphore",
            )?;
            let created = sys::iree_hal_fence_create_at(semaphore, 1, ffi::allocator(), &mut fence.0);
            sys::iree_hal_semaphore_release(semaphore);
            check(created, "creating a fence")?;
            let mut wait = sys::iree_vm_ref_t::default();
            check(sys::iree_vm_list_push_ref_move(inputs.0, &mut wait), "passing the wait fence")?;
            let mut r = sys::iree_hal_fence_retain_ref(fence.0);
            check(sys::iree_vm_list_push_ref_move(inputs.0, &mut r), "passing the signal fence")?;
        }
        Ok(fence)
    }
}

/// A HAL fence we hold one reference to.
struct Fence(*mut sys::iree_hal_fence_t);

impl Drop for Fence {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: we own one reference, released once here.
            unsafe { sys::iree_hal_fence_release(self.0) };
        }
    }
}

/// A started function call ([`Session::start`]). Its results are the
/// device's to write until it is done; dropping it before then waits.
pub struct Invocation {
    name: String,
    outputs: VmList,
    /// Signalled when the results are ready; `None` for a synchronous call.
    signal: Option<Fence>,
    device: Device,
}

impl fmt::Debug for Invocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Invocation").field("name", &self.name).field("asynchronous", &self.signal.is_some()).finish()
    }
}

impl Invocation {
    /// Whether the results are ready, without waiting. A failure on the
    /// device is returned here.
    pub fn is_done(&self) -> Result<bool> {
        let Some(fence) = &self.signal else { return Ok(true) };
        // SAFETY: the fence is live; a DEFERRED status is a bare code (no
        // payload to free); any other status is consumed by `check`.
        let status = unsafe { sys::iree_hal_fence_query(fence.0) };
        if ffi::status_code(status) == ffi::STATUS_DEFERRED {
            return Ok(false);
        }
        check(status, "running a function").map_err(|e| name_error(e, &self.name))?;
        Ok(true)
    }

    /// Waits up to `timeout` for the results; `Ok(false)` when they are not
    /// ready by then.
    pub fn wait(&self, timeout: std::time::Duration) -> Result<bool> {
        let Some(fence) = &self.signal else { return Ok(true) };
        let nanos = i64::try_from(timeout.as_nanos()).unwrap_or(i64::MAX);
        // SAFETY: the fence is live; a DEADLINE_EXCEEDED status is a bare
        // code; any other status is consumed by `check`.
        let status = unsafe {
            sys::iree_hal_fence_wait(
                fence.0,
                sys::iree_timeout_t { type_: sys::iree_timeout_type_e_IREE_TIMEOUT_RELATIVE, nanos: nanos as _ },
                0,
            )
        };
        if ffi::status_code(status) == ffi::STATUS_DEADLINE_EXCEEDED {
            return Ok(false);
        }
        check(status, "running a function").map_err(|e| name_error(e, &self.name))?;
        Ok(true)
    }

    /// Waits for the results and returns them.
    pub fn finish(self) -> Result<Vec<DeviceTensor>> {
        while !self.wait(std::time::Duration::from_secs(3600))? {}
        // SAFETY: `outputs` is live; each element is retained before wrapping.
        let count = unsafe { sys::iree_vm_list_size(self.outputs.0) };
        let mut results = Vec::with_capacity(count);
        for i in 0..count {
            // SAFETY: index < size; get_ref_retain gives us one reference,
            // which check_deref borrows and `from_retained` takes over.
            unsafe {
                let mut r = sys::iree_vm_ref_t::default();
                check(sys::iree_vm_list_get_ref_retain(self.outputs.0, i, &mut r), "reading a result")?;
                let mut view = null_mut();
                if let Err(e) = check(sys::iree_hal_buffer_view_check_deref(r, &mut view), "reading a result") {
                    sys::iree_vm_ref_release(&mut r);
                    return Err(e);
                }
                results.push(DeviceTensor::from_retained(view, &self.device)?);
            }
        }
        Ok(results)
    }
}

impl Drop for Invocation {
    fn drop(&mut self) {
        // The device may still write the results (and read the arguments):
        // keep them until it is done. A failure has nowhere to go but the log.
        if let Some(fence) = &self.signal {
            // SAFETY: the fence is live; the status is consumed by `check`.
            let status = unsafe {
                sys::iree_hal_fence_wait(
                    fence.0,
                    sys::iree_timeout_t { type_: sys::iree_timeout_type_e_IREE_TIMEOUT_ABSOLUTE, nanos: i64::MAX as _ },
                    0,
                )
            };
            if let Err(e) = check(status, "waiting for a dropped call") {
                tracing::warn!("{}: {e}", self.name);
            }
        }
    }
}

/// Prefixes an IREE error with the module or function it came from.
fn name_error(e: Error, name: &str) -> Error {
    match e {
        Error::Iree { operation, message } => Error::Iree { operation, message: format!("{name}: {message}") },
        other => other,
    }
}

/// Lists a bytecode module's exports with their reflected signatures.
///
/// # Safety
/// `module` must be a live module.
unsafe fn exported_functions(module: *mut sys::iree_vm_module_t) -> Result<Vec<FunctionInfo>> {
    // SAFETY: `module` is live (caller's contract); names and attributes are
    // copied out while it is.
    unsafe {
        let module_name = ffi::owned_string(sys::iree_vm_module_name(module));
        let signature = sys::iree_vm_module_signature(module);
        let mut out = Vec::with_capacity(signature.export_function_count);
        for ordinal in 0..signature.export_function_count {
            let mut function = sys::iree_vm_function_t::default();
            check(
                sys::iree_vm_module_lookup_function_by_ordinal(
                    module,
                    sys::iree_vm_function_linkage_e_IREE_VM_FUNCTION_LINKAGE_EXPORT,
                    ordinal,
                    &mut function,
                ),
                "listing exported functions",
            )?;
            let name = ffi::owned_string(sys::iree_vm_function_name(&function));
            let decl = ffi::owned_string(sys::iree_vm_function_lookup_attr_by_name(
                &function,
                string_view("iree.abi.declaration"),
            ));
            let args = if decl.is_empty() { None } else { parse_declaration(&decl) };
            let model =
                ffi::owned_string(sys::iree_vm_function_lookup_attr_by_name(&function, string_view("iree.abi.model")));
            let asynchronous = model == "coarse-fences";
            out.push(FunctionInfo { name: format!("{module_name}.{name}"), args, asynchronous, function });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_integers_are_checked_against_their_u32_words() {
        assert_eq!(packed_bits("tensor<64x64xi4>"), Some(4));
        assert_eq!(packed_bits("tensor<64x64xi8>"), Some(8));
        assert_eq!(packed_bits("tensor<64x64xf32>"), None);
        assert!(packs("tensor<448x64xi4>", 4, "U32", &[448, 8]));
        assert!(packs("tensor<448x64xi8>", 8, "U32", &[448, 16]));
        assert!(!packs("tensor<448x64xi8>", 8, "U32", &[448, 8]), "4-bit words read as 8-bit");
        assert!(!packs("tensor<448x64xi4>", 4, "U32", &[224, 16]), "another row count");
        assert!(!packs("tensor<448x64xi4>", 4, "I32", &[448, 8]), "not u32 words");
    }

    #[test]
    fn a_matrix_is_tiled_row_r_input_i_at_r_over_rows_i_over_depth_and_their_remainders() {
        for (elem, rows, depth, out, inputs) in [
            (2, 4, 1, 12, 5),
            (4, 2, 1, 6, 3),
            (1, 3, 1, 9, 4),
            (2, 32, 1, 64, 7),
            (2, 4, 1, 4, 1),
            (2, 16, 2, 32, 6),
            (2, 4, 2, 8, 2),
            (4, 2, 3, 4, 9),
            (1, 2, 2, 4, 4),
        ] {
            let src: Vec<u8> = (0..out * inputs * elem).map(|i| (i * 7 % 251) as u8).collect();
            let mut dst = vec![0u8; src.len()];
            tile_rows(&src, &mut dst, out, inputs, Tile { rows, depth }, elem);
            for r in 0..out {
                for i in 0..inputs {
                    let stored = &src[(r * inputs + i) * elem..][..elem];
                    let at = (((r / rows) * (inputs / depth) + i / depth) * rows + r % rows) * depth + i % depth;
                    let tiled = &dst[at * elem..][..elem];
                    assert_eq!(
                        stored, tiled,
                        "row {r} input {i} of {out}x{inputs} in tiles of {rows}x{depth}, {elem} bytes"
                    );
                }
            }
        }
        let tile = |rows, depth| Tile { rows, depth };
        assert_eq!(tiled_view("model.embed_tokens.weight|tile32"), Some(("model.embed_tokens.weight", tile(32, 1))));
        assert_eq!(tiled_view("w|tile16x2"), Some(("w", tile(16, 2))));
        assert_eq!(tiled_view("model.embed_tokens.weight"), None);
        assert_eq!(tiled_view("w|tile0"), None);
        assert_eq!(tiled_view("w|tilex"), None);
        assert_eq!(tiled_view("w|tile16x0"), None);
        assert_eq!(tiled_view("w|tile16x"), None);
    }

    #[test]
    fn packed_4_bit_integers_are_tiled_as_integers_two_rows_a_byte_low_nibble_first() {
        for (rows, out, inputs) in [(2, 2, 2), (4, 12, 6), (16, 48, 10), (16, 16, 64), (32, 96, 4)] {
            let src: Vec<u8> = (0..out * inputs / 2).map(|i| (i * 37 % 256) as u8).collect();
            let mut dst = vec![0u8; src.len()];
            tile_nibbles(&src, &mut dst, out, inputs, Tile { rows, depth: 1 });
            let nibble = |bytes: &[u8], at: usize| (bytes[at / 2] >> (4 * (at % 2))) & 0x0f;
            for r in 0..out {
                for i in 0..inputs {
                    let at = ((r / rows) * inputs + i) * rows + r % rows;
                    assert_eq!(
                        nibble(&src, r * inputs + i),
                        nibble(&dst, at),
                        "row {r} input {i} of {out}x{inputs} in tiles of {rows}"
                    );
                }
            }
        }
    }

    #[test]
    fn declarations_parse_into_argument_specs() {
        let d = "sync func @step(%input0: tensor<1x4xf32>, %input1: tensor<i32>, %input2: tensor<?x4xbf16> {iree.abi.output = 0 : index}) -> (%output0: tensor<1x4xf32>)";
        let args = parse_declaration(d).expect("parses");
        assert_eq!(
            args,
            vec![
                ArgSpec::Tensor { dtype: DType::F32, dims: vec![Some(1), Some(4)] },
                ArgSpec::Tensor { dtype: DType::I32, dims: vec![] },
                ArgSpec::Tensor { dtype: DType::BF16, dims: vec![None, Some(4)] },
            ]
        );
        assert_eq!(parse_declaration("sync func @noop() -> ()"), Some(vec![]));
    }
}
