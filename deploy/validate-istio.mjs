// Validates the Istio and Gateway API objects of deploy/ (tests/e2e/deploy.rs).
//
//   node deploy/validate-istio.mjs DOCS.json
//
// DOCS.json is written by deploy/validate.py: [{"label": "...", "object": {...}}].
// Each object is checked twice:
//  1. against its CRD schema as compiled by npm @kubernetes-models/istio 3.0.1
//     (Istio 1.29 CRDs: EnvoyFilter, PeerAuthentication) and
//     @kubernetes-models/gateway-api 2.0.0: types,
//     enums, patterns, required fields;
//  2. for unknown fields, which those validators accept (a misspelt field
//     would surface only when applied): the key tables below, hand-kept from
//     Istio's EnvoyFilter CRD and Gateway API v1.6's Gateway, HTTPRoute and
//     GatewayClass CRDs, down to the levels deploy/ uses.
// The packages come from `just setup` (npm ci into .tools/node). Prints one line
// per failure (label: error) and exits 1 if there was any.

import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const repo = join(dirname(fileURLToPath(import.meta.url)), "..");
const models = join(repo, ".tools", "node", "node_modules", "@kubernetes-models");

const classes = {
  "networking.istio.io/v1alpha3 EnvoyFilter": ["istio", "networking.istio.io/v1alpha3/EnvoyFilter.js", "EnvoyFilter"],
  "gateway.networking.k8s.io/v1 Gateway": ["gateway-api", "gateway.networking.k8s.io/v1/Gateway.js", "Gateway"],
  "gateway.networking.k8s.io/v1 HTTPRoute": ["gateway-api", "gateway.networking.k8s.io/v1/HTTPRoute.js", "HTTPRoute"],
  "gateway.networking.k8s.io/v1 GatewayClass": ["gateway-api", "gateway.networking.k8s.io/v1/GatewayClass.js", "GatewayClass"],
  "security.istio.io/v1 PeerAuthentication": ["istio", "security.istio.io/v1/PeerAuthentication.js", "PeerAuthentication"],
};

// Key tables: an object lists the allowed keys of a map (applied to every item
// of an array); `true` accepts anything below.
const ANY = true;
const metadata = { name: ANY, namespace: ANY, labels: ANY, annotations: ANY };
const subFilter = { name: ANY };
const keyTables = {
  EnvoyFilter: {
    apiVersion: ANY, kind: ANY, metadata,
    spec: {
      workloadSelector: { labels: ANY },
      targetRefs: { group: ANY, kind: ANY, name: ANY, namespace: ANY },
      priority: ANY,
      configPatches: {
        applyTo: ANY,
        match: {
          context: ANY,
          proxy: { proxyVersion: ANY, metadata: ANY },
          listener: {
            portNumber: ANY, portName: ANY, name: ANY, listenerFilter: ANY,
            filterChain: {
              name: ANY, sni: ANY, transportProtocol: ANY, applicationProtocols: ANY,
              destinationPort: ANY, transportSocket: ANY,
              filter: { name: ANY, subFilter },
            },
          },
          routeConfiguration: {
            portNumber: ANY, portName: ANY, gateway: ANY, name: ANY,
            vhost: { name: ANY, domainName: ANY, route: { name: ANY, action: ANY } },
          },
          cluster: { portNumber: ANY, service: ANY, subset: ANY, name: ANY },
          waypoint: { portNumber: ANY, filter: { name: ANY, subFilter }, route: { name: ANY } },
        },
        // `value` is Envoy configuration: validate.py assembles it into a
        // bootstrap that `envoy --mode validate` checks.
        patch: { operation: ANY, value: ANY, filterClass: ANY },
      },
    },
  },
  Gateway: {
    apiVersion: ANY, kind: ANY, metadata,
    spec: {
      gatewayClassName: ANY, addresses: ANY, allowedListeners: ANY, defaultScope: ANY, tls: ANY,
      infrastructure: { annotations: ANY, labels: ANY, parametersRef: { group: ANY, kind: ANY, name: ANY } },
      listeners: {
        name: ANY, hostname: ANY, port: ANY, protocol: ANY, tls: ANY,
        allowedRoutes: { kinds: ANY, namespaces: { from: ANY, selector: ANY } },
      },
    },
  },
  HTTPRoute: {
    apiVersion: ANY, kind: ANY, metadata,
    spec: {
      hostnames: ANY, useDefaultGateways: ANY,
      parentRefs: { group: ANY, kind: ANY, name: ANY, namespace: ANY, port: ANY, sectionName: ANY },
      rules: {
        name: ANY, filters: ANY, retry: ANY, sessionPersistence: ANY,
        matches: { headers: ANY, method: ANY, queryParams: ANY, path: { type: ANY, value: ANY } },
        backendRefs: { filters: ANY, group: ANY, kind: ANY, name: ANY, namespace: ANY, port: ANY, weight: ANY },
        timeouts: { request: ANY, backendRequest: ANY },
      },
    },
  },
  GatewayClass: {
    apiVersion: ANY, kind: ANY, metadata,
    spec: { controllerName: ANY, description: ANY, parametersRef: ANY },
  },
  PeerAuthentication: {
    apiVersion: ANY, kind: ANY, metadata,
    spec: {
      selector: { matchLabels: ANY }, targetRef: ANY, targetRefs: ANY,
      mtls: { mode: ANY },
      // Keyed by port number: each value is a mode.
      portLevelMtls: ANY,
    },
  },
};

function unknownKeys(value, table, path, out) {
  if (table === ANY || value === null || typeof value !== "object") return;
  if (Array.isArray(value)) {
    value.forEach((item, i) => unknownKeys(item, table, `${path}/${i}`, out));
    return;
  }
  for (const [key, sub] of Object.entries(value)) {
    if (!(key in table)) {
      out.push(`${path}/${key}: unknown field (not in the ${Object.keys(table).join(", ")} this level allows)`);
    } else {
      unknownKeys(sub, table[key], `${path}/${key}`, out);
    }
  }
}

const docs = JSON.parse(readFileSync(process.argv[2], "utf8"));
const failures = [];
let checked = 0;
for (const { label, object } of docs) {
  const key = `${object.apiVersion} ${object.kind}`;
  const entry = classes[key];
  if (!entry) {
    failures.push(`${label}: no validator for ${key}`);
    continue;
  }
  const [pkg, file, name] = entry;
  const mod = await import(pathToFileURL(join(models, pkg, file)).href);
  try {
    new mod[name](object).validate();
  } catch (e) {
    failures.push(`${label}: ${e.message}`);
  }
  const unknown = [];
  unknownKeys(object, keyTables[object.kind], "", unknown);
  for (const u of unknown) failures.push(`${label}: ${u}`);
  checked += 1;
}
for (const f of failures) console.log(f);
console.log(`validate-istio: ${checked} object(s) checked, ${failures.length} failure(s)`);
process.exit(failures.length ? 1 : 0);
