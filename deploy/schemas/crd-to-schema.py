#!/usr/bin/env python3
"""Turns a CRD's openAPIV3Schema into the JSON Schema deploy/validate.py
reads (how deploy/schemas/inferencepool*.json were made):

    python3 deploy/schemas/crd-to-schema.py CRD.yaml VERSION ID TITLE > deploy/schemas/NAME.json

The served version VERSION's schema, with: every object that lists its
properties refusing others (the API server would prune them silently: a
typo would go unnoticed), `metadata` checked as deploy/schemas/common.json
says, apiVersion, kind, metadata and spec required and the first two
fixed, and the Kubernetes extensions (x-kubernetes-*, CEL rules among them)
left out.
"""

import json
import sys

import yaml


def convert(node):
    if isinstance(node, list):
        return [convert(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: convert(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def main():
    crd_path, version, schema_id, title = sys.argv[1:5]
    crd = yaml.safe_load(open(crd_path))
    served = next(v for v in crd["spec"]["versions"] if v["name"] == version)
    schema = convert(served["schema"]["openAPIV3Schema"])
    group = crd["spec"]["group"]
    props = schema["properties"]
    props["apiVersion"] = {"const": f"{group}/{version}"}
    props["kind"] = {"const": crd["spec"]["names"]["kind"]}
    props["metadata"] = {"$ref": "pd-router:common#/$defs/metadata"}
    schema["required"] = ["apiVersion", "kind", "metadata"] + [r for r in schema.get("required", [])]
    out = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": schema_id, "title": title}
    out.update(schema)
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
