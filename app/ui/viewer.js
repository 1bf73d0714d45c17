// The episode viewer: the catalog, a dataset's episodes, and one episode's charts and camera frames on one time
// cursor. Data comes only through the server's public API (the same requests as any client): JSON for the
// catalog and episode lists, Arrow IPC streams from /rows for the charts and the frames. Frames are fetched for
// the cursor's row as it moves, one request in flight, always for the latest position.
//
// Page state is exposed as `window.episerveViewer` (read by the browser tests and handy in the console).
(() => {
  "use strict";

  const TOKEN_KEY = "episerve.token";
  const STANDARD_COLUMNS = new Set(["timestamp", "frame_index", "episode_index", "index", "task_index"]);
  const NUMERIC_DTYPES = new Set([
    "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
  ]);
  const NUMERIC_ARROW = "(?:halffloat|float|double|u?int\\d+)";
  const SCALAR_TYPE = new RegExp(`^${NUMERIC_ARROW}$`);
  const VECTOR_TYPE = new RegExp(`^fixed_size_list<[^:]*: ${NUMERIC_ARROW}(?: not null)?>\\[(\\d+)\\]$`);
  const LIST_TYPE = new RegExp(`^(?:large_)?list<[^:]*: ${NUMERIC_ARROW}(?: not null)?>$`);
  // The server's rule for dataset ids (app/store/catalog.py, validate_dataset_id): `name` or `org/name`.
  const ID_PART = /^[A-Za-z0-9_][A-Za-z0-9._-]*$/;
  const PLACEHOLDER_FILL = "#8a93a3"; // a camera's canvas for a row without an image to draw
  const MAX_EPISODE_ROWS = 2000; // episode table rows rendered at once; the filter narrows the rest
  const FRAME_CACHE = 64; // cursor positions whose frames are kept for stepping back and forth

  const viewer = {
    apiBase: new URL("../", document.baseURI), // the page is served at <prefix>/ui/
    datasets: null,
    infos: new Map(),
    episodeLists: new Map(),
    route: null,
    view: null, // the episode on screen: see openEpisode
    message: null,
    ready: false, // true once the current route has rendered (or failed with a message)
  };
  window.episerveViewer = viewer;

  const $ = (id) => document.getElementById(id);

  // ---- API ---------------------------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, detail) {
      super(detail);
      this.status = status;
    }
  }

  /** A dataset id (from the address) that the server would refuse: never put into a request path. */
  class InvalidDatasetId extends Error {}

  let pendingToken = null;

  /** A request to the API, relative to the server's root; asks for a token on 401/403 and retries. */
  async function api(path, { arrow = false } = {}) {
    for (;;) {
      const headers = { Accept: arrow ? "application/vnd.apache.arrow.stream" : "application/json" };
      const token = sessionStorage.getItem(TOKEN_KEY);
      if (token) headers.Authorization = `Bearer ${token}`;
      const response = await fetch(new URL(path, viewer.apiBase), { headers });
      if (response.status === 401 || response.status === 403) {
        if (token) sessionStorage.removeItem(TOKEN_KEY);
        await askForToken(
          response.status === 401
            ? "This server requires a bearer token."
            : "The token was not accepted; enter another one.",
        );
        continue;
      }
      if (!response.ok) {
        let detail = `${response.status} ${response.statusText}`;
        try {
          const problem = await response.json();
          detail = problem.detail || problem.title || detail;
        } catch (_) {
          // not a problem body: keep the status line
        }
        throw new ApiError(response.status, detail);
      }
      if (!arrow) return response.json();
      return Arrow.tableFromIPC(new Uint8Array(await response.arrayBuffer()));
    }
  }

  function askForToken(reason) {
    if (!pendingToken) {
      pendingToken = new Promise((resolve) => {
        const form = $("token-form");
        $("token-reason").textContent = reason;
        form.hidden = false;
        $("token-input").focus();
        form.onsubmit = (event) => {
          event.preventDefault();
          sessionStorage.setItem(TOKEN_KEY, $("token-input").value.trim());
          $("token-input").value = "";
          form.hidden = true;
          pendingToken = null;
          resolve();
        };
      });
    }
    return pendingToken;
  }

  /** Why the server would refuse `id` as a dataset id, or null. Checked before the id goes into any path: a
   * `..` part would otherwise make the request resolve outside `datasets/`. */
  function datasetIdProblem(id) {
    if (!id) return "it is empty";
    const parts = id.split("/");
    if (parts.some((part) => part === "" || part === "." || part === "..")) {
      return "it has an empty, '.' or '..' path part";
    }
    if (parts.length > 2) return "it has more than one '/' (expected 'name' or 'org/name')";
    if (!parts.every((part) => ID_PART.test(part))) {
      return "each part must start with a letter, digit or '_' and hold only letters, digits, '.', '_' and '-'";
    }
    return null;
  }

  function checkDatasetId(id) {
    const problem = datasetIdProblem(id);
    if (problem) throw new InvalidDatasetId(`'${id}' is not a valid dataset id: ${problem}.`);
  }

  function datasetPath(id) {
    checkDatasetId(id);
    return "datasets/" + id.split("/").map(encodeURIComponent).join("/");
  }

  // One request per dataset, shared by everyone who asks; a failed one is forgotten so that a retry asks again.
  async function remembered(cache, id, request) {
    if (!cache.has(id)) cache.set(id, request());
    try {
      return await cache.get(id);
    } catch (error) {
      cache.delete(id);
      if (error instanceof ApiError && error.status === 404) {
        throw new ApiError(404, `Dataset '${id}' was not found: ${error.message}`);
      }
      throw error;
    }
  }

  function datasetInfo(id) {
    return remembered(viewer.infos, id, () => api(datasetPath(id)));
  }

  function episodeList(id) {
    return remembered(viewer.episodeLists, id, () =>
      api(datasetPath(id) + "/episodes").then((body) => body.episodes),
    );
  }

  // ---- what a dataset holds ----------------------------------------------------------------------------------

  /** Labels of a feature's dimensions from its metadata `names` (a list, or a dict of lists), else `name[i]`. */
  function dimensionLabels(name, dims, names) {
    let list = Array.isArray(names) ? names : null;
    if (!list && names && typeof names === "object") list = Object.values(names).find(Array.isArray) || null;
    if (list) list = list.flat(Infinity);
    if (list && list.length === dims) return list.map(String);
    return dims === 1 ? [name] : Array.from({ length: dims }, (_, i) => `${name}[${i}]`);
  }

  /** The numeric (scalar, fixed-size or variable-length list) columns to chart: [{name, dims, names}]. `dims` is
   * null for a list whose metadata gives no shape: the episode's longest list decides it (see chartDimensions). */
  function chartFeatures(info) {
    const skip = new Set([...STANDARD_COLUMNS, info.episode_column]);
    const found = [];
    for (const { name, type, video } of info.columns) {
      if (video || skip.has(name)) continue;
      const feature = (info.features && info.features[name]) || {};
      if (feature.dtype && !NUMERIC_DTYPES.has(feature.dtype)) continue;
      const dims = typeDimensions(type, feature.shape);
      if (dims !== 0) found.push({ name, dims, names: feature.names });
    }
    return found;
  }

  /** Values per row of a numeric Arrow type: its size, null for a list of no known shape, 0 if not numeric. */
  function typeDimensions(type, shape) {
    const vector = VECTOR_TYPE.exec(type);
    if (vector) return Number(vector[1]);
    if (SCALAR_TYPE.test(type)) return 1;
    if (!LIST_TYPE.test(type)) return 0;
    return Array.isArray(shape) && shape.length ? shape.reduce((a, b) => a * b, 1) : null;
  }

  /** Camera videos (raw RGB from the server's frame reads) and parquet image columns (encoded images). */
  function cameraFeatures(info) {
    const cameras = info.columns
      .filter((c) => c.video)
      .map((c) => ({ name: c.name, kind: "video", shape: c.video.shape, tier: tierText(c.frames) }));
    for (const [name, feature] of Object.entries(info.features || {})) {
      const column = info.columns.find((c) => c.name === name);
      if (feature.dtype === "image" && column && !column.video) {
        cameras.push({ name, kind: "image", shape: feature.shape });
      }
    }
    return cameras;
  }

  /** A video camera's frame tier as `/datasets/<id>` states it (its `frames`): exact frames, or a lossy tier with
   * its quality and the PSNR the server measured against the exact frames. Null when the server does not say. */
  function tierText(frames) {
    if (!frames) return null;
    if (!frames.lossy) return "exact frames";
    const psnr = typeof frames.psnr_db === "number" ? `PSNR ~${frames.psnr_db.toFixed(1)} dB` : "PSNR not measured";
    return `${frames.tier.toUpperCase()} q${frames.quality}, lossy (${psnr})`;
  }

  // ---- Arrow -> arrays ---------------------------------------------------------------------------------------

  // apache-arrow slices a chunk's value and offset buffers to the chunk, so row j's values start at 0-based
  // positions in them; a chunk's `offset` only applies to its validity bitmap (which getValid reads).

  /** Where row `j` of a chunk keeps its values in the leaf (the chunk itself, or a list's child): [begin, end). */
  function valueSpan(data, j) {
    if (data.valueOffsets) return [Number(data.valueOffsets[j]), Number(data.valueOffsets[j + 1])];
    const size = data.children.length ? data.type.listSize : 1;
    return [j * size, (j + 1) * size];
  }

  /** A column's values as one plain array per dimension: null where a row is null or has no such dimension (a
   * shorter list). Reads the typed arrays directly: 280,000 values of an episode take a few milliseconds this way,
   * far less than `get(i)` per row. */
  function columnArrays(table, name, dims) {
    const rows = table.numRows;
    const out = Array.from({ length: dims }, () => new Array(rows).fill(null));
    let row = 0;
    for (const data of table.getChild(name).data) {
      const leaf = data.children.length ? data.children[0] : data;
      const values = leaf.values;
      const number = valueReader(leaf.type, values);
      for (let j = 0; j < data.length; j++, row++) {
        if (data.nullCount !== 0 && !data.getValid(j)) continue;
        const [begin, end] = valueSpan(data, j);
        for (let d = 0, k = begin; d < dims && k < end; d++, k++) {
          if (leaf.nullCount !== 0 && !leaf.getValid(k)) continue;
          out[d][row] = number(values[k]);
        }
      }
    }
    return out;
  }

  /** How a raw item of a numeric leaf's typed array becomes a number: 64-bit integers arrive as bigints, and
   * float16 as its bit pattern (a Uint16Array). */
  function valueReader(type, values) {
    if (type.typeId === Arrow.Type.Float && type.precision === Arrow.Precision.HALF) return Arrow.util.uint16ToFloat64;
    return typeof values[0] === "bigint" ? Number : (value) => value;
  }

  /** A feature's dimensions: its known size, or the longest list the episode holds. */
  function chartDimensions(table, feature) {
    if (feature.dims !== null) return feature.dims;
    let longest = 0;
    for (const data of table.getChild(feature.name).data) {
      for (let j = 0; j < data.length; j++) {
        const [begin, end] = valueSpan(data, j);
        longest = Math.max(longest, end - begin);
      }
    }
    return longest;
  }

  // ---- views -------------------------------------------------------------------------------------------------

  function show(viewId) {
    for (const id of ["catalog-view", "dataset-view", "episode-view"]) $(id).hidden = id !== viewId;
  }

  function showMessage(text, kind = "error") {
    const box = $("message");
    box.textContent = text;
    box.className = kind;
    box.hidden = false;
    viewer.message = text;
  }

  function clearMessage() {
    $("message").hidden = true;
    viewer.message = null;
  }

  /** The breadcrumb after "episerve": `› demo › episode 12`, each part a link. */
  function crumbs(parts) {
    $("crumbs").replaceChildren(
      ...parts.flatMap(([text, href]) => {
        const separator = document.createElement("span");
        separator.className = "separator";
        separator.textContent = "›";
        separator.setAttribute("aria-hidden", "true");
        return [separator, link(text, href)];
      }),
    );
  }

  function cell(row, content, className) {
    const td = row.insertCell();
    if (content instanceof Node) td.append(content);
    else td.textContent = content === null || content === undefined ? "–" : String(content);
    if (className) td.className = className;
    return td;
  }

  function link(text, href) {
    const a = document.createElement("a");
    a.textContent = text;
    a.href = href;
    return a;
  }

  const hashFor = (params) => "#" + new URLSearchParams(params).toString();
  const number = (value) => (typeof value === "number" ? value.toLocaleString("en-US") : value);

  function cacheText(cache) {
    if (!cache) return "–";
    let text = `${cache.segments_built}/${cache.segments_total} segments`;
    if (cache.frame_segments) text += `, ${cache.frame_segments.built} frame segments`;
    return text;
  }

  async function showCatalog() {
    crumbs([]);
    // Fresh descriptions (cache state moves); a dataset's views reuse them until the catalog is shown again.
    viewer.infos.clear();
    viewer.episodeLists.clear();
    show("catalog-view");
    const body = await api("datasets");
    viewer.datasets = body.datasets;
    const tbody = $("datasets").tBodies[0];
    tbody.replaceChildren();
    const rows = new Map();
    for (const dataset of body.datasets) {
      const row = tbody.insertRow();
      row.dataset.id = dataset.id;
      cell(row, link(dataset.id, hashFor({ dataset: dataset.id })));
      cell(row, dataset.format);
      cell(row, number(dataset.rows), "number");
      cell(row, number(dataset.episodes), "number");
      cell(row, dataset.fps, "number");
      rows.set(dataset.id, [cell(row, "…", "muted"), cell(row, "…", "muted")]);
    }
    if (!body.datasets.length) showMessage("This server serves no datasets.", "info");
    await showMixtures();
    viewer.ready = true;
    // Cameras and cache state come with each dataset's description: a few requests at a time.
    const queue = [...rows.keys()];
    const worker = async () => {
      for (let id = queue.shift(); id !== undefined; id = queue.shift()) {
        const [cameras, cache] = rows.get(id);
        try {
          const info = await datasetInfo(id);
          const list = cameraFeatures(info).map((c) => `${c.name}${c.shape ? ` (${c.shape.join("×")})` : ""}`);
          cameras.textContent = list.length ? list.join(", ") : "none";
          cache.textContent = cacheText(info.cache);
        } catch (error) {
          cameras.textContent = cache.textContent = `unavailable: ${error.message}`;
        }
        cameras.className = cache.className = "";
      }
    };
    await Promise.all([worker(), worker(), worker(), worker()]);
  }

  /** The server's named mixtures under the datasets: each component with its weight and share of an epoch. */
  async function showMixtures() {
    const section = $("mixtures-section");
    let body;
    try {
      body = await api("mixtures");
    } catch (error) {
      section.hidden = true; // a server without mixtures (or an older one): nothing to list
      return;
    }
    const tbody = $("mixtures").tBodies[0];
    tbody.replaceChildren();
    for (const mixture of body.mixtures) {
      const row = tbody.insertRow();
      row.dataset.id = mixture.id;
      cell(row, mixture.id);
      const list = cell(row, "");
      for (const component of mixture.components) {
        const item = document.createElement("div");
        const share = `${(100 * component.share).toFixed(1)} %`;
        const pick = component.episodes ? `, episodes ${component.episodes}` : "";
        item.append(link(component.dataset, hashFor({ dataset: component.dataset })));
        item.append(` ×${component.weight}: ${share}${pick}`);
        list.append(item);
      }
      cell(row, number(mixture.components.reduce((sum, component) => sum + component.rows, 0)), "number");
      cell(row, mixture.version);
    }
    section.hidden = body.mixtures.length === 0;
  }

  async function showDataset(id) {
    crumbs([[id, hashFor({ dataset: id })]]);
    const [info, episodes] = await Promise.all([datasetInfo(id), episodeList(id)]);
    show("dataset-view");
    $("dataset-title").textContent = id;
    const cameras = cameraFeatures(info).map((c) => c.name);
    $("dataset-summary").textContent =
      `${info.format}, ${number(info.rows)} rows, ${number(info.episodes)} episodes, ` +
      `${info.fps ?? "no"} fps, cameras: ${cameras.length ? cameras.join(", ") : "none"}; ` +
      `cache: ${cacheText(info.cache)}`;
    const tasks = [...new Set([...Object.values(info.tasks || {}), ...episodes.flatMap((e) => e.tasks || [])])];
    const select = $("filter-task");
    select.replaceChildren(new Option("any task", ""), ...tasks.sort().map((t) => new Option(t, t)));
    $("filter-min").value = $("filter-max").value = "";
    const render = () => renderEpisodes(id, info, episodes);
    $("episode-filter").oninput = render;
    $("episode-filter").onsubmit = (event) => event.preventDefault();
    render();
    viewer.ready = true;
  }

  function renderEpisodes(id, info, episodes) {
    const task = $("filter-task").value;
    const min = $("filter-min").value === "" ? -Infinity : Number($("filter-min").value);
    const max = $("filter-max").value === "" ? Infinity : Number($("filter-max").value);
    const matching = episodes.filter(
      (e) => e.length >= min && e.length <= max && (!task || (e.tasks || []).includes(task)),
    );
    const tbody = $("episodes").tBodies[0];
    tbody.replaceChildren();
    for (const episode of matching.slice(0, MAX_EPISODE_ROWS)) {
      const row = tbody.insertRow();
      row.dataset.episode = episode.episode_index;
      cell(row, link(String(episode.episode_index), hashFor({ dataset: id, episode: episode.episode_index })));
      cell(row, number(episode.length), "number");
      cell(row, info.fps ? (episode.length / info.fps).toFixed(2) : "–", "number");
      cell(row, (episode.tasks || []).join("; "));
    }
    const shown = Math.min(matching.length, MAX_EPISODE_ROWS);
    $("filter-count").textContent =
      `${number(matching.length)} of ${number(episodes.length)} episodes` +
      (shown < matching.length ? ` (first ${number(shown)} listed; narrow the filter)` : "");
    viewer.filteredEpisodes = matching.map((e) => e.episode_index);
  }

  // ---- the episode view --------------------------------------------------------------------------------------

  /** The row an address's `frame=` asks for, or 0 without one. */
  function requestedFrame(frameText) {
    if (frameText === null || frameText === "") return 0;
    if (!/^\d+$/.test(frameText)) throw new ApiError(422, `'${frameText}' is not a frame number`);
    return Number(frameText);
  }

  /** The address of the episode on screen at its cursor (`frame=` once the cursor has left frame 0), put in place
   * without a new history entry or a reload, so it can be copied and shared at any moment. */
  function rememberFrame(view) {
    if (view !== viewer.view || view.playing) return;
    const params = { dataset: view.dataset, episode: view.episode };
    if (view.cursor) params.frame = view.cursor;
    const hash = hashFor(params);
    if (hash === location.hash) return;
    history.replaceState(null, "", hash);
    viewer.route = { ...viewer.route, frame: view.cursor ? String(view.cursor) : null, hash };
  }

  async function openEpisode(id, episodeText, frameText = null) {
    const started = performance.now();
    crumbs([
      [id, hashFor({ dataset: id })],
      [`episode ${episodeText}`, hashFor({ dataset: id, episode: episodeText })],
    ]);
    if (!/^\d+$/.test(episodeText)) {
      throw new ApiError(422, `'${episodeText}' is not an episode number`);
    }
    const episode = Number(episodeText);
    const frame = requestedFrame(frameText);
    const [info, episodes] = await Promise.all([datasetInfo(id), episodeList(id)]);
    const described = performance.now() - started;
    const entry = episodes.find((e) => e.episode_index === episode);
    if (!entry) {
      const range = info.episode_range ? ` (its episodes are ${info.episode_range[0]}–${info.episode_range[1]})` : "";
      throw new ApiError(404, `Episode ${episode} is not in dataset '${id}'${range}.`);
    }
    closeEpisode();
    const features = chartFeatures(info);
    const view = {
      dataset: id,
      episode,
      length: entry.length,
      tasks: entry.tasks || [],
      fps: info.fps || 30,
      features: features.map((f) => f.name),
      cameras: cameraFeatures(info),
      x: null,
      charts: {},
      plots: [],
      cursor: 0,
      shownFrame: null,
      frameRequests: 0,
      frameErrors: 0,
      frameCache: new Map(),
      inFlight: false,
      playing: false,
      timings: { describedMs: described },
    };
    view.episodeQuery = episodeQuery(info, view);
    viewer.view = view;
    show("episode-view");
    $("episode-title").textContent = `${id} · episode ${episode}`;
    const rate = info.fps
      ? `at ${view.fps} fps (${(view.length / view.fps).toFixed(2)} s)`
      : `(the dataset records no fps: played at ${view.fps} fps)`;
    $("episode-summary").textContent =
      `${number(view.length)} frames ${rate}` +
      (view.tasks.length ? ` · task: ${view.tasks.join("; ")}` : "");
    const position = episodes.indexOf(entry);
    const neighbours = { "previous-episode": episodes[position - 1], "next-episode": episodes[position + 1] };
    for (const [anchorId, neighbour] of Object.entries(neighbours)) {
      const anchor = $(anchorId);
      anchor.hidden = !neighbour;
      if (!neighbour) continue;
      anchor.href = hashFor({ dataset: id, episode: neighbour.episode_index });
      const label = `episode ${neighbour.episode_index}`;
      anchor.textContent = anchorId === "next-episode" ? `${label} →` : `← ${label}`;
    }
    setUpPlayer(view);
    setUpCameras(view);
    if (frame > view.length - 1) {
      showMessage(`Frame ${frame} is past the episode's last frame, ${view.length - 1}: showing that one.`, "info");
    }
    view.cursor = Math.min(frame, view.length - 1);
    $("scrub").value = String(view.cursor);
    showPosition(view);
    const firstFrames = pumpFrames(view);
    await loadCharts(view, info, features);
    view.timings.chartsMs = performance.now() - started;
    await firstFrames;
    view.timings.openMs = performance.now() - started;
    view.timings.sinceNavigationMs = performance.now(); // the page's clock starts when it began to load
  }

  /** `episodes=N&`, or nothing for a dataset without an episode column (all of it is one episode). */
  function episodeQuery(info, view) {
    return info.episode_column ? `episodes=${view.episode}&` : "";
  }

  async function loadCharts(view, info, features) {
    const hasTimestamp = info.columns.some((c) => c.name === "timestamp");
    const columns = [...(hasTimestamp ? ["timestamp"] : []), ...features.map((f) => f.name)];
    const container = $("charts");
    container.replaceChildren();
    let table = null;
    if (columns.length) {
      const query = `${episodeQuery(info, view)}columns=${columns.map(encodeURIComponent).join(",")}`;
      const asked = performance.now();
      table = await api(`${datasetPath(view.dataset)}/rows?${query}`, { arrow: true });
      view.timings.rowsMs = performance.now() - asked; // request, transfer and Arrow decoding
    }
    if (view !== viewer.view) return;
    view.x = hasTimestamp
      ? columnArrays(table, "timestamp", 1)[0]
      : Array.from({ length: view.length }, (_, i) => i / view.fps);
    const width = Math.max(400, container.clientWidth - 4); // the resize handler keeps it so
    for (const feature of features) {
      const dims = chartDimensions(table, feature);
      const labels = dimensionLabels(feature.name, dims, feature.names);
      const values = columnArrays(table, feature.name, dims);
      const spans = values.map(valueRange);
      view.charts[feature.name] = { labels, values };
      const box = document.createElement("div");
      box.className = "chart";
      box.dataset.feature = feature.name;
      container.append(box);
      const entry = { plot: null, marker: document.createElement("div"), feature: feature.name, scaled: false };
      entry.marker.className = "cursor-marker";
      entry.plot = new uPlot(
        {
          title: feature.name,
          width,
          height: 240,
          scales: { x: { time: false } },
          series: [
            { label: "time (s)", value: (_, v) => (v === null ? "–" : v.toFixed(3)) },
            ...labels.map((label, i) => ({
              label,
              stroke: `hsl(${(i * 137.508) % 360}, 65%, 42%)`,
              width: 1,
              // The recorded value, also when the chart draws each dimension scaled to its own range.
              value: (_, v, _series, row) => {
                const recorded = row === null || row === undefined ? null : values[i][row];
                return recorded === null || recorded === undefined ? "–" : recorded.toFixed(4);
              },
            })),
          ],
          axes: [{ label: "time (s)" }, {}],
          legend: { live: true },
          hooks: {
            // After every draw (the first one, a zoom, a resize) the marker follows the new scale.
            draw: [() => placeMarker(view, entry)],
            // The legend shows the values at the time cursor from the start, and again once the mouse leaves.
            ready: [(plot) => plot.setLegend({ idx: view.cursor })],
            setCursor: [(plot) => plot.cursor.idx == null && plot.setLegend({ idx: view.cursor })],
          },
        },
        [view.x, ...values],
        box,
      );
      entry.plot.over.append(entry.marker);
      if (dims > 1) box.prepend(scaleToggle(view, entry, values, spans));
      entry.plot.over.addEventListener("click", (event) => {
        const index = entry.plot.posToIdx(event.offsetX);
        if (index !== null && index !== undefined) setCursor(view, index);
      });
      view.plots.push(entry);
    }
    if (!features.length) {
      const note = document.createElement("p");
      note.className = "muted";
      note.textContent = "This dataset has no numeric columns to chart.";
      container.append(note);
    }
    moveMarkers(view);
  }

  /** [min, max] of a dimension's values, nulls left out; null when it has none. */
  function valueRange(values) {
    let low = Infinity;
    let high = -Infinity;
    for (const v of values) {
      if (v === null || !Number.isFinite(v)) continue;
      if (v < low) low = v;
      if (v > high) high = v;
    }
    return low <= high ? [low, high] : null;
  }

  /** A checkbox that draws each dimension of a chart on its own scale (its min..max mapped to 0..1), for
   * dimensions whose ranges differ by orders of magnitude; the legend keeps showing the recorded values. */
  function scaleToggle(view, entry, values, spans) {
    const widths = spans.filter(Boolean).map(([low, high]) => high - low);
    const widest = Math.max(0, ...widths);
    const narrowest = Math.min(...widths.filter((w) => w > 0), Infinity);
    const ratio = widest > 0 && Number.isFinite(narrowest) ? widest / narrowest : 1;
    const label = document.createElement("label");
    label.className = "scale-toggle";
    const box = document.createElement("input");
    box.type = "checkbox";
    box.onchange = () => setScaled(view, entry, values, spans, box.checked);
    const note = ratio >= 100 ? ` (their ranges differ ${Math.round(ratio).toLocaleString("en-US")}×)` : "";
    label.append(box, ` each dimension on its own scale${note}`);
    return label;
  }

  function setScaled(view, entry, values, spans, scaled) {
    const data = scaled
      ? values.map((dimension, i) => {
          const span = spans[i];
          if (!span) return dimension;
          const width = span[1] - span[0];
          return dimension.map((v) => (v === null ? null : width > 0 ? (v - span[0]) / width : 0.5));
        })
      : values;
    entry.scaled = scaled;
    entry.plot.setData([view.x, ...data]);
    entry.plot.setLegend({ idx: view.cursor });
  }

  function closeEpisode() {
    const view = viewer.view;
    if (!view) return;
    view.playing = false;
    for (const { plot } of view.plots) plot.destroy();
    viewer.view = null;
  }

  // ---- the time cursor ---------------------------------------------------------------------------------------

  function setUpPlayer(view) {
    const scrub = $("scrub");
    scrub.max = String(Math.max(0, view.length - 1));
    scrub.value = "0";
    scrub.oninput = () => setCursor(view, Number(scrub.value));
    $("step-back").onclick = () => setCursor(view, view.cursor - 1);
    $("step-forward").onclick = () => setCursor(view, view.cursor + 1);
    $("play").onclick = () => (view.playing ? pause(view) : play(view));
    $("play").textContent = "play";
    showPosition(view);
  }

  function setCursor(view, row) {
    if (view !== viewer.view) return;
    const clamped = Math.max(0, Math.min(view.length - 1, Math.round(row)));
    if (clamped === view.cursor) return;
    view.cursor = clamped;
    $("scrub").value = String(clamped);
    showPosition(view);
    moveMarkers(view);
    pumpFrames(view);
    rememberFrame(view);
  }

  function showPosition(view) {
    const seconds = view.x ? view.x[view.cursor] : view.cursor / view.fps;
    const time = typeof seconds === "number" ? seconds.toFixed(3) : "–";
    $("position").value = `frame ${view.cursor} / ${view.length - 1} · ${time} s`;
  }

  function moveMarkers(view) {
    for (const entry of view.plots) {
      placeMarker(view, entry);
      entry.plot.setLegend({ idx: view.cursor }); // the legend shows the values at the cursor
    }
  }

  function placeMarker(view, { plot, marker }) {
    if (!view.x || !plot) return;
    const left = plot.valToPos(view.x[view.cursor], "x");
    if (!Number.isFinite(left)) return; // not laid out yet: the first draw places it
    marker.style.left = `${left}px`;
    marker.hidden = !(left >= 0 && left <= plot.over.clientWidth);
  }

  function play(view) {
    if (view.cursor >= view.length - 1) setCursor(view, 0);
    view.playing = true;
    $("play").textContent = "pause";
    const startRow = view.cursor;
    const startTime = performance.now();
    const tick = (now) => {
      if (!view.playing || view !== viewer.view) return;
      const row = startRow + Math.floor(((now - startTime) / 1000) * view.fps);
      setCursor(view, row);
      if (row >= view.length - 1) pause(view);
      else requestAnimationFrame(tick);
    };
    requestAnimationFrame(tick);
  }

  function pause(view) {
    view.playing = false;
    $("play").textContent = "play";
    rememberFrame(view);
  }

  window.addEventListener("resize", () => {
    const view = viewer.view;
    if (!view || !view.plots.length) return;
    const width = Math.max(400, $("charts").clientWidth - 4);
    for (const { plot } of view.plots) plot.setSize({ width, height: 240 });
  });

  document.addEventListener("keydown", (event) => {
    const view = viewer.view;
    if (!view || $("episode-view").hidden || event.target.matches("input, select, textarea")) return;
    if (event.key === " ") {
      event.preventDefault();
      view.playing ? pause(view) : play(view);
    } else if (event.key === "ArrowLeft") setCursor(view, view.cursor - 1);
    else if (event.key === "ArrowRight") setCursor(view, view.cursor + 1);
  });

  // ---- camera frames -----------------------------------------------------------------------------------------

  function setUpCameras(view) {
    const container = $("cameras");
    container.replaceChildren();
    for (const camera of view.cameras) {
      const figure = document.createElement("figure");
      figure.className = "camera";
      figure.dataset.camera = camera.name;
      const canvas = document.createElement("canvas");
      if (camera.shape && camera.kind === "video") [canvas.height, canvas.width] = camera.shape;
      const caption = document.createElement("figcaption");
      const label = document.createElement("span");
      label.className = "frame-label";
      label.textContent = camera.name;
      caption.append(label);
      if (camera.tier) {
        const tier = document.createElement("span");
        tier.className = "frame-tier";
        tier.textContent = camera.tier;
        caption.append(tier);
      }
      figure.append(canvas, caption);
      container.append(figure);
      camera.figure = figure;
      camera.canvas = canvas;
      camera.caption = label;
    }
  }

  /** Fetches and draws the frames of the cursor's row; one request in flight, then the latest position. */
  async function pumpFrames(view) {
    if (view.inFlight || !view.cameras.length) return;
    view.inFlight = true;
    try {
      while (view === viewer.view && view.shownFrame !== view.cursor) {
        const row = view.cursor;
        let table = view.frameCache.get(row);
        if (!table) {
          const columns = view.cameras.map((c) => encodeURIComponent(c.name)).join(",");
          const query = `${view.episodeQuery}start=${row}&stop=${row + 1}&columns=${columns}`;
          view.frameRequests += 1;
          table = await api(`${datasetPath(view.dataset)}/rows?${query}`, { arrow: true });
          view.frameCache.set(row, table);
          if (view.frameCache.size > FRAME_CACHE) view.frameCache.delete(view.frameCache.keys().next().value);
        }
        if (view !== viewer.view) return;
        await drawFrames(view, table, row);
        view.shownFrame = row;
      }
    } catch (error) {
      view.frameErrors += 1;
      showMessage(`Could not show the frames of row ${view.cursor}: ${error.message}`);
    } finally {
      view.inFlight = false;
    }
  }

  async function drawFrames(view, table, row) {
    for (const camera of view.cameras) {
      const value = table.getChild(camera.name).get(0);
      let missing = null;
      if (camera.kind === "video") drawRgb(camera, value);
      else missing = await drawEncoded(camera, value);
      camera.caption.textContent = `${camera.name} · frame ${row}` + (missing ? ` · ${missing}` : "");
      camera.figure.classList.toggle("missing", Boolean(missing));
    }
  }

  /** Raw (height, width, 3) uint8 RGB from the server's frame read, into the canvas pixel for pixel. */
  function drawRgb(camera, value) {
    const [height, width, channels] = camera.shape;
    const rgb = value.toArray();
    const image = new ImageData(width, height);
    const rgba = image.data;
    for (let pixel = 0, source = 0, target = 0; pixel < width * height; pixel++, source += channels, target += 4) {
      rgba[target] = rgb[source];
      rgba[target + 1] = rgb[source + (channels > 1 ? 1 : 0)];
      rgba[target + 2] = rgb[source + (channels > 2 ? 2 : 0)];
      rgba[target + 3] = 255;
    }
    camera.canvas.getContext("2d").putImageData(image, 0, 0);
  }

  /** A parquet image cell (LeRobot: a struct of encoded `bytes` and a `path`). Returns why nothing could be
   * drawn (the canvas then shows a placeholder, not the previous row's image), or null once drawn. */
  async function drawEncoded(camera, value) {
    const bytes = value && (value.bytes !== undefined ? value.bytes : value);
    if (!bytes) {
      drawPlaceholder(camera);
      const path = value && value.path;
      if (!path) return "no image in this row";
      return `no image in this row, only its path (${path}), which the server does not serve`;
    }
    const bitmap = await createImageBitmap(new Blob([bytes]), { colorSpaceConversion: "none" });
    camera.canvas.width = bitmap.width;
    camera.canvas.height = bitmap.height;
    camera.canvas.getContext("2d").drawImage(bitmap, 0, 0);
    bitmap.close();
    return null;
  }

  function drawPlaceholder(camera) {
    if (camera.shape) [camera.canvas.height, camera.canvas.width] = camera.shape;
    const context = camera.canvas.getContext("2d");
    context.fillStyle = PLACEHOLDER_FILL;
    context.fillRect(0, 0, camera.canvas.width, camera.canvas.height);
  }

  // ---- routing -----------------------------------------------------------------------------------------------

  async function route() {
    const params = new URLSearchParams(location.hash.slice(1));
    const dataset = params.get("dataset");
    const episode = params.get("episode");
    const frame = params.get("frame");
    const open = viewer.view;
    if (open && episode !== null && dataset === open.dataset && episode === String(open.episode)) {
      // Only the frame changed (an edited or pasted address): move the cursor, keep the episode.
      viewer.route = { dataset, episode, frame, hash: location.hash };
      clearMessage();
      try {
        const row = requestedFrame(frame);
        setCursor(open, Math.min(row, open.length - 1));
      } catch (error) {
        showMessage(error.message);
      }
      return;
    }
    viewer.route = { dataset, episode, frame, hash: location.hash };
    viewer.ready = false;
    clearMessage();
    try {
      if (dataset !== null) checkDatasetId(dataset);
      if (!dataset) {
        closeEpisode();
        await showCatalog();
      } else if (episode === null) {
        closeEpisode();
        await showDataset(dataset);
      } else {
        await openEpisode(dataset, episode, frame);
      }
    } catch (error) {
      closeEpisode();
      show(null);
      const expected = error instanceof ApiError || error instanceof InvalidDatasetId;
      showMessage(expected ? error.message : `Something went wrong: ${error.message}`);
    }
    viewer.ready = true;
  }

  if (typeof Arrow === "undefined" || typeof uPlot === "undefined") {
    showMessage(
      "The viewer's libraries (uPlot and apache-arrow) are not installed on this server.\n" +
        "They ship in app/ui/vendor of the server's wheel and of its git checkout: reinstall the server, or in a " +
        "checkout restore that folder (git checkout app/ui/vendor) or rebuild it with `make ui` (needs nodejs and " +
        "npm), then reload this page.",
    );
    viewer.ready = true;
    return;
  }
  viewer.setCursor = (row) => viewer.view && setCursor(viewer.view, row);
  window.addEventListener("hashchange", route);
  route();
})();
