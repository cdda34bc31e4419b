// Validate Prometheus Operator objects (a JSON list on stdin) with the generated validators of
// @kubernetes-models/prometheus-operator (built from the operator's CRD OpenAPI v3 schemas).
// Prints one line per problem; exits 0 when there is none.
import { readFileSync } from "node:fs";
import { PodMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PodMonitor";
import { PrometheusRule } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PrometheusRule";

const kinds = { PodMonitor, PrometheusRule };
let bad = 0;
for (const doc of JSON.parse(readFileSync(0, "utf8"))) {
  const Model = kinds[doc.kind];
  const name = `${doc.kind}/${doc.metadata?.name}`;
  if (!Model) { console.log(`${name}: no validator for this kind`); bad++; continue; }
  try { new Model(doc).validate(); } catch (e) { console.log(`${name}: ${e.message}`); bad++; }
}
process.exit(bad ? 1 : 0);
