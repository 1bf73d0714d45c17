// Copies the viewer's third-party browser libraries from node_modules (installed by `npm ci`, pinned by
// package-lock.json) into app/ui/vendor, with the licence and notice files of everything they bundle and a
// manifest.json naming each package, its version and licence. app/ui/vendor is kept in git, so installing or
// running the server needs no Node; this script is how a maintainer updates it after changing a pin.
//
//   npm ci && node build.mjs           rewrite app/ui/vendor
//   npm ci && node build.mjs --check   exit 1 if app/ui/vendor differs from what the pins give (CI runs this)
import { copyFileSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const vendor = join(here, "..", "app", "ui", "vendor");

// package -> { file in the package: file in app/ui/vendor }. apache-arrow's bundle inlines flatbuffers,
// json-with-bigint and tslib, so their licences travel with it.
const packages = {
  "apache-arrow": {
    "Arrow.es2015.min.js": "arrow.min.js",
    "LICENSE.txt": "arrow.LICENSE.txt",
    "NOTICE.txt": "arrow.NOTICE.txt",
  },
  flatbuffers: { LICENSE: "arrow.flatbuffers.LICENSE.txt" },
  "json-with-bigint": { LICENSE: "arrow.json-with-bigint.LICENSE.txt" },
  tslib: { "LICENSE.txt": "arrow.tslib.LICENSE.txt" },
  uplot: {
    "dist/uPlot.iife.min.js": "uplot.min.js",
    "dist/uPlot.min.css": "uplot.min.css",
    LICENSE: "uplot.LICENSE.txt",
  },
};

function build(out) {
  mkdirSync(out, { recursive: true });
  const manifest = [];
  for (const [name, files] of Object.entries(packages)) {
    const root = join(here, "node_modules", name);
    const meta = JSON.parse(readFileSync(join(root, "package.json"), "utf8"));
    for (const [source, target] of Object.entries(files)) {
      copyFileSync(join(root, source), join(out, target));
    }
    manifest.push({ package: name, version: meta.version, license: meta.license, files: Object.values(files) });
  }
  writeFileSync(join(out, "manifest.json"), JSON.stringify(manifest, null, 2) + "\n");
}

function differences(built, kept) {
  const names = (dir) => readdirSync(dir).sort();
  let keptNames = [];
  try {
    keptNames = names(kept);
  } catch {
    return [`${kept} is missing`];
  }
  const all = [...new Set([...names(built), ...keptNames])].sort();
  return all.filter((name) => {
    try {
      return !readFileSync(join(built, name)).equals(readFileSync(join(kept, name)));
    } catch {
      return true;
    }
  });
}

if (process.argv.includes("--check")) {
  const scratch = mkdtempSync(join(tmpdir(), "episerve-vendor-"));
  try {
    build(scratch);
    const differ = differences(scratch, vendor);
    if (differ.length) {
      console.error(`app/ui/vendor differs from the pinned libraries: ${differ.join(", ")} (run: make ui)`);
      process.exit(1);
    }
    console.log("app/ui/vendor holds exactly the pinned libraries");
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
} else {
  rmSync(vendor, { recursive: true, force: true });
  build(vendor);
  console.log(`viewer libraries copied into ${vendor}`);
}
