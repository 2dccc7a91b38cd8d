// Validates a classic Grafana dashboard (default deploy/grafana/pd-router.json)
// and lists its PromQL, for deploy/grafana/check_queries.py.
//
//   node deploy/grafana/validate.mjs [DASHBOARD.json] > queries.json
//
// 1. Type check with tsc (strict, noEmit) against @grafana/schema 13.2.3:
//    - the whole dashboard: the JSON is wrapped, verbatim, as an object literal
//      in a generated .ts file under a temp dir,
//        export const dashboard: DashboardJson = <the JSON text>;
//      where DashboardJson is the classic `Dashboard`
//      (dist/types/raw/dashboard/x/types.gen). The object literal gets
//      excess-property checks, so a misspelt key (`gridpos`) fails, as do
//      missing required fields, wrong types, bad enum values, duplicate keys.
//    - each panel's `options` and `fieldConfig.defaults.custom`, which
//      `Dashboard` leaves as Record<string, unknown>: against the panel
//      plugin's own `Options` / `FieldConfig` (raw/composable/<plugin>/panelcfg,
//      e.g. timeseries, state-timeline), with every property optional
//      (Grafana fills in missing options from the plugin's defaults) but
//      unknown keys, wrong types and bad enum values failing. Panel types
//      without such types are listed in `options_unchecked`.
//    In both, each string enum (FieldColorModeId, ThresholdsMode, MappingType,
//    LegendDisplayMode, ...) is replaced by the union of its values: TypeScript
//    never accepts the literal "absolute" for `ThresholdsMode`, although that
//    string is exactly what the JSON holds. Numeric enums (VariableRefresh,
//    VariableHide, ...) are kept; tsc accepts a number only if it is a member.
//    Not checked: `targets[]` (Record<string, unknown> in the schema; the
//    PromQL is for check_queries.py), and which of Panel / RowPanel a row
//    matches (a row without `collapsed` still passes as a Panel).
// 2. Checks the types cannot make: unique panel ids, targets with a non-empty
//    `expr` and unique `refId`s, every `$var` used in a query is a dashboard
//    variable or a Grafana built-in, panels inside the 24-column grid and not
//    overlapping.
// 3. Output (stdout, one JSON document):
//      {"dashboard": PATH, "uid", "title", "schemaVersion", "options_unchecked": [...],
//       "variables": [{"name", "type", "query", "allValue", "regex"}],
//       "queries":   [{"panel_id", "panel", "row", "refId", "expr", "legend"}]}
//    `variables[].query` is the variable's query string (for a `query`
//    variable, e.g. `label_values(pd_router_pod_selected, pd_model)`), null
//    if it has none.
// On failure: the errors on stderr (the dashboard's as PATH:LINE:COL: error
// TSxxxx: ..., lines of the JSON file; the panels' as PATH: panel ID "TITLE"
// (TYPE) options: error ...), nothing on stdout, exit 1. Exit 2 when the tools
// are missing. TypeScript 5.9.3 and @grafana/schema come from `just setup`
// (npm ci into .tools/grafana, pinned by deploy/grafana/package-lock.json).

import { mkdtempSync, readFileSync, rmSync, writeFileSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, relative, resolve } from "node:path";
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const repo = resolve(here, "..", "..");
const tools = join(repo, ".tools", "grafana", "node_modules");
const tscBin = join(tools, "typescript", "bin", "tsc");
const schemaTypes = join(tools, "@grafana", "schema", "dist", "types", "raw", "dashboard", "x", "types.gen");

const file = resolve(process.argv[2] ?? join(here, "pd-router.json"));
const rel = relative(process.cwd(), file);
const shown = rel && !rel.startsWith("..") ? rel : file;

function fail(lines, code = 1) {
  for (const l of lines) process.stderr.write(`${l}\n`);
  process.exit(code);
}

if (!existsSync(tscBin) || !existsSync(`${schemaTypes}.d.ts`)) {
  fail([
    `validate.mjs: ${tscBin} or ${schemaTypes}.d.ts missing;`,
    "run `just setup` (npm ci --prefix .tools/grafana from deploy/grafana/package-lock.json)",
  ], 2);
}

const text = readFileSync(file, "utf8");
let dash;
try {
  dash = JSON.parse(text);
} catch (e) {
  fail([`${shown}: not JSON: ${e.message}`]);
}

// ---- 1. tsc against @grafana/schema's Dashboard, and each panel's options
const typesTs = `import type { Dashboard } from ${JSON.stringify(schemaTypes)};

// A string enum becomes the union of its values (what a JSON file can hold);
// plain \`string\`, string literal unions, numeric enums, numbers, booleans and
// null stay as they are; objects and arrays are mapped member by member, so
// optional and required properties, and excess-property checks, are kept.
export type Json<T> =
  T extends string ? (string extends T ? string : \`\${T}\`)
  : T extends number | boolean | null | undefined ? T
  : T extends ReadonlyArray<infer U> ? Array<Json<U>>
  : T extends object ? { [K in keyof T]: Json<T[K]> }
  : T;
// The same with every property optional (Grafana fills in a panel's missing
// options from the plugin's defaults); unknown keys and wrong types still fail.
export type Partial_<T> =
  T extends string ? (string extends T ? string : \`\${T}\`)
  : T extends number | boolean | null | undefined ? T
  : T extends ReadonlyArray<infer U> ? Array<Partial_<U>>
  : T extends object ? { [K in keyof T]?: Partial_<T[K]> }
  : T;
export type IsAny<T> = 0 extends (1 & T) ? true : false;

export type DashboardJson = Json<Dashboard>;
`;
const prefix = 'import type { DashboardJson } from "./types"; export const dashboard: DashboardJson = ';

// Panel options (`options`, `fieldConfig.defaults.custom`) are untyped in
// Dashboard; the core panel plugins' own types (raw/composable/<plugin>/panelcfg)
// check them: one line per panel in panels.ts. Other panel types are skipped.
const composable = join(tools, "@grafana", "schema", "dist", "types", "raw", "composable");
const alias = { dashlist: "dashboardlist", annolist: "annotationslist" };
const panelLines = [
  'import type { Partial_, IsAny } from "./types";',
  'import type * as common from "@grafana/schema";',
  // If @grafana/schema did not resolve, its types would be `any` (skipLibCheck
  // hides the error) and nothing below would be checked.
  "export const commonResolved: IsAny<common.VizLegendOptions> = false;",
];
const panelWhere = new Map(); // line number in panels.ts -> what
const skipped = [];
const imported = new Set();
function walkPanels(list, fn) {
  for (const p of list ?? []) {
    if (p?.type === "row") walkPanels(p.panels, fn);
    else if (p) fn(p);
  }
}
walkPanels(dash.panels, (p) => {
  if (typeof p.type !== "string") return;
  const mod = alias[p.type] ?? p.type.toLowerCase().replace(/-/g, "");
  const dts = join(composable, mod, "panelcfg", "x", "types.gen.d.ts");
  if (!/^[a-z0-9]+$/.test(mod) || !existsSync(dts)) {
    skipped.push(`panel ${p.id} type ${p.type}`);
    return;
  }
  const src = readFileSync(dts, "utf8");
  if (!imported.has(mod)) {
    panelLines.push(`import type * as ${mod} from ${JSON.stringify(dts.replace(/\.d\.ts$/, ""))};`);
    imported.add(mod);
  }
  const label = `panel ${p.id} "${p.title ?? ""}" (${p.type})`;
  if (p.options !== undefined && /export interface Options\b/.test(src)) {
    panelWhere.set(panelLines.length + 1, `${label} options`);
    panelLines.push(`export const p${panelLines.length}: Partial_<${mod}.Options> = ${JSON.stringify(p.options)};`);
  }
  const custom = p.fieldConfig?.defaults?.custom;
  if (custom !== undefined && /export interface FieldConfig\b/.test(src)) {
    panelWhere.set(panelLines.length + 1, `${label} fieldConfig.defaults.custom`);
    panelLines.push(`export const p${panelLines.length}: Partial_<${mod}.FieldConfig> = ${JSON.stringify(custom)};`);
  }
});

const tsconfig = {
  compilerOptions: {
    strict: true,
    noEmit: true,
    moduleResolution: "node",
    module: "commonjs",
    target: "es2020",
    skipLibCheck: true,
    types: [],
    // The panel types import "@grafana/schema", whose package.json has only
    // `exports` (which "node" resolution ignores): point it at its index.
    paths: { "@grafana/schema": [join(tools, "@grafana", "schema", "dist", "types", "index.d.ts")] },
  },
  files: ["dashboard.ts", "panels.ts"],
};

const dir = mkdtempSync(join(tmpdir(), "pd-grafana-"));
let tsc;
try {
  writeFileSync(join(dir, "types.ts"), typesTs);
  // The JSON text starts on line 1, so tsc's line numbers are the file's.
  writeFileSync(join(dir, "dashboard.ts"), `${prefix}${text.trimEnd()};\n`);
  writeFileSync(join(dir, "panels.ts"), `${panelLines.join("\n")}\n`);
  writeFileSync(join(dir, "tsconfig.json"), JSON.stringify(tsconfig, null, 2));
  // Run in the temp dir so tsc names the files `dashboard.ts`, `panels.ts`.
  tsc = spawnSync(process.execPath, [tscBin, "-p", ".", "--pretty", "false"], { cwd: dir, encoding: "utf8" });
} finally {
  rmSync(dir, { recursive: true, force: true });
}
if (tsc.error) fail([`validate.mjs: running tsc: ${tsc.error.message}`], 2);
if (tsc.status !== 0) {
  const out = `${tsc.stdout}${tsc.stderr}`.trimEnd().split("\n");
  fail(out.map((l) =>
    l.replace(/^dashboard\.ts\((\d+),(\d+)\)/, (_, ln, col) => {
      const c = ln === "1" ? Number(col) - prefix.length : Number(col);
      return `${shown}:${ln}:${c}`;
    }).replace(/^panels\.ts\((\d+),(\d+)\)/, (m, ln) =>
      panelWhere.has(Number(ln)) ? `${shown}: ${panelWhere.get(Number(ln))}` : m),
  ).concat([`${shown}: does not type-check against @grafana/schema (tsc exit ${tsc.status})`]));
}

// ---- 2. checks the types cannot make
const errors = [];
const builtins = new Set([
  "__rate_interval", "__rate_interval_ms", "__interval", "__interval_ms", "__range", "__range_s",
  "__range_ms", "__from", "__to", "__now", "__dashboard", "__org", "__user", "__name", "__series",
  "__field", "__value", "__data", "__timezone",
]);
const variables = (dash.templating?.list ?? []).map((v) => ({
  name: v.name,
  type: v.type,
  query: typeof v.query === "string" ? v.query : (v.query?.query ?? null),
  allValue: v.allValue ?? null,
  regex: v.regex ?? "",
}));
const varNames = new Set(variables.map((v) => v.name));
const varRef = /\$\{([A-Za-z0-9_]+)(?::[^}]*)?\}|\[\[([A-Za-z0-9_]+)(?::[^\]]*)?\]\]|\$([A-Za-z0-9_]+)/g;
function checkRefs(where, s) {
  for (const m of s.matchAll(varRef)) {
    const n = m[1] ?? m[2] ?? m[3];
    if (!varNames.has(n) && !builtins.has(n)) errors.push(`${where}: unknown variable $${n}`);
  }
}
for (const v of variables) {
  if (v.query && v.type === "query") checkRefs(`variable ${v.name}`, v.query);
}

const ids = new Map();
const queries = [];
const cells = new Map();
function place(p, label) {
  const g = p.gridPos;
  if (!g) return;
  if (g.x < 0 || g.w < 1 || g.x + g.w > 24 || g.y < 0 || g.h < 1) {
    errors.push(`${label}: gridPos ${JSON.stringify(g)} outside the 24-column grid`);
    return;
  }
  for (let y = g.y; y < g.y + g.h; y++) {
    for (let x = g.x; x < g.x + g.w; x++) {
      const k = `${x},${y}`;
      if (cells.has(k)) {
        errors.push(`${label}: overlaps ${cells.get(k)} at x=${x} y=${y}`);
        return;
      }
      cells.set(k, label);
    }
  }
}
function visit(p, row) {
  const label = `panel ${p.id} "${p.title ?? ""}"`;
  if (ids.has(p.id)) errors.push(`${label}: id also used by ${ids.get(p.id)}`);
  ids.set(p.id, label);
  place(p, label);
  if (p.type === "row") {
    // A collapsed row keeps its panels inside; they are laid out when it opens.
    for (const c of p.panels ?? []) visit(c, p.title ?? "");
    return;
  }
  const targets = p.targets ?? [];
  if (targets.length === 0) errors.push(`${label}: no targets`);
  const refIds = new Set();
  for (const t of targets) {
    if (typeof t.expr !== "string" || t.expr.trim() === "") {
      errors.push(`${label} target ${t.refId ?? "?"}: no expr`);
      continue;
    }
    if (typeof t.refId !== "string" || refIds.has(t.refId)) {
      errors.push(`${label}: refId ${JSON.stringify(t.refId)} missing or repeated`);
    }
    refIds.add(t.refId);
    checkRefs(`${label} target ${t.refId}`, t.expr);
    queries.push({
      panel_id: p.id, panel: p.title ?? "", row, refId: t.refId, expr: t.expr,
      legend: t.legendFormat ?? null,
    });
  }
}
let row = null;
for (const p of dash.panels ?? []) {
  if (p.type === "row") row = p.title ?? "";
  visit(p, p.type === "row" ? null : row);
}
if (errors.length) fail(errors.map((e) => `${shown}: ${e}`));

process.stdout.write(`${JSON.stringify({
  dashboard: shown, uid: dash.uid ?? null, title: dash.title ?? null,
  schemaVersion: dash.schemaVersion, options_unchecked: skipped, variables, queries,
}, null, 2)}\n`);
