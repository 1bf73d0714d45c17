// Copies the viewer's third-party browser libraries from node_modules (installed by `npm ci`, pinned by
// package-lock.json) into app/ui/vendor, where the server serves them. Run: npm ci && node build.mjs
import { copyFileSync, mkdirSync, rmSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const vendor = join(here, "..", "app", "ui", "vendor");
const files = {
  "apache-arrow/Arrow.es2015.min.js": "arrow.min.js",
  "apache-arrow/LICENSE.txt": "arrow.LICENSE.txt",
  "uplot/dist/uPlot.iife.min.js": "uplot.min.js",
  "uplot/dist/uPlot.min.css": "uplot.min.css",
  "uplot/LICENSE": "uplot.LICENSE.txt",
};

rmSync(vendor, { recursive: true, force: true });
mkdirSync(vendor, { recursive: true });
for (const [source, target] of Object.entries(files)) {
  copyFileSync(join(here, "node_modules", source), join(vendor, target));
}
console.log(`viewer libraries copied into ${vendor}`);
