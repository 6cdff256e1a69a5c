package render_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/keel-dev/keel/render"
)

// FuzzRender feeds arbitrary bytes to the reader as a spec file, next to a
// valid cluster.yaml and lock: it must never panic or hang, and must either
// render or return an *InvalidError whose every diagnostic has a position.
func FuzzRender(f *testing.F) {
	seeds := []string{
		"apiVersion: keel/v1\nkind: Jail\nmetadata: {name: a}\nspec: {image: base/x}\n",
		"apiVersion: keel/v1\nkind: Service\nmetadata: {name: web}\nspec:\n  replicas: 3\n  port: 80\n  template: {image: base/x, volumes: [{name: d, mountPath: /d, size: 1G}]}\n",
		"apiVersion: keel/v1\nkind: Ingress\nmetadata: {name: i}\nspec: {host: a.b, backend: {service: web}}\n",
		"a: &x [*x]\n",
		"---\n---\n- [\n",
		"apiVersion: keel/v1\nkind: Jail\nmetadata: &m {name: a}\nspec: {<<: *m}\n",
		"apiVersion: keel/v1\nkind: Node\nmetadata: {name: n}\nspec: {address: 10.0.0.1, podCIDR: 10.200.1.0/24}\n",
		"\xef\xbb\xbfapiVersion: keel/v1\nkind: Jail\n",
		"apiVersion: keel/v1\nkind: Jail\nmetadata: {name: a, labels: {x: }}\nspec: {image: base/x, command: [/bin/sh, null], env: {A: ~}, volumes: [~]}\n",
		"apiVersion: keel/v1\nkind: Jail\nmetadata: {name: a}\nspec: {image: " + strings.Repeat("[", 40) + strings.Repeat("]", 40) + "}\n",
		"apiVersion: keel/v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  port: 80\n  template:\n    image: base/x\n    restartPolicy: Always\n   node: n1\n",
		"apiVersion: keel/v1\nkind: Service\nmetadata: {name: web}\nspec: {replicas: 10000, port: 80, template: {image: base/x, command: [], node: \"\"}}\n---\napiVersion: keel/v1\nkind: Service\nmetadata: {name: api}\nspec: {replicas: 10000, port: 80, template: {image: base/x}}\n",
		"apiVersion: keel/v1\nkind: Ingress\nmetadata: {name: i}\nspec: {host: a.b, path: \"\", backend: {service: web, port: 0}}\n",
		"apiVersion: keel/v1\nkind: Jail\nmetadata: {name: a}\nspec: {image: base/x, env: &e {A: b, C: d}, volumes: [*e, *e, *e], command: &c [x, *c]}\n",
		"apiVersion: keel/v1\nkind: Jail\nmetadata: {name: a}\nspec: {image: base/x, network: {address: 10.200.1.5/24}, volumes: [{name: d, mountPath: /d, size: 1G}]}\n---\napiVersion: keel/v1\nkind: Jail\nmetadata: {name: b}\nspec: {image: base/x, node: n1, network: {address: 10.200.1.127/25}, volumes: [{name: d, mountPath: /e, size: 1G}]}\n",
		"apiVersion: keel/v1\nkind: Service\nmetadata: {name: web}\nspec:\n  replicas: 3\n  port: 80\n  strategy: {maxUnavailable: 25%, maxSurge: 1, minReadySeconds: 5, progressDeadline: 1m, failureAction: pause}\n  template:\n    image: base/x\n    terminationGracePeriod: 30s\n    checks:\n      startup: {tcp: {}}\n      readiness: {http: {path: /healthz, host: a.b, status: 200-299}, period: 2s, timeout: 1s, successThreshold: 2}\n      liveness: {exec: {command: [/bin/ok]}, failureThreshold: 5}\n",
		"apiVersion: keel/v1\nkind: Jail\nmetadata: {name: a}\nspec:\n  image: base/x\n  volumes: [{name: d, mountPath: /var/db}]\n  artifacts:\n    - {url: \"https://a.example/x?s=1\", sha256: " + strings.Repeat("A", 64) + ", path: /usr/local/bin/x, mode: 0755}\n    - {url: oci://r.example/t/x@sha256:" + strings.Repeat("0", 64) + ", sha256: " + strings.Repeat("1", 63) + "f, path: /opt/x, archive: tar.zst}\n    - {url: http://u:p@a/x#f, sha256: ~, path: /var/db/x/, mode: \"0o4755\", archive: tgz}\n",
		"apiVersion: keel/v1\nkind: Service\nmetadata: {name: web}\nspec:\n  port: 80\n  template:\n    image: base/x\n    artifacts: [{url: \"https://a.example/x\", sha256: " + strings.Repeat("b", 64) + ", path: /x, mode: 0o600}, {url: https://a.example/y, sha256: " + strings.Repeat("c", 64) + ", path: /x/y}]\n",
	}
	for _, s := range seeds {
		f.Add([]byte(s), []byte("apiVersion: keel/v1\nkind: Lock\nsubnets: {n1: 10.200.1.0/24}\nvips: {web: 10.201.0.9}\npins: {}\n"))
	}
	f.Fuzz(func(t *testing.T, spec, lock []byte) {
		fsys := fstest.MapFS{
			"cluster.yaml":  {Data: []byte("apiVersion: keel/v1\nkind: Cluster\nmetadata: {name: fuzz}\n")},
			"nodes/n1.yaml": {Data: []byte("apiVersion: keel/v1\nkind: Node\nmetadata: {name: n1}\nspec: {address: 192.0.2.1}\n")},
			"apps/x.yaml":   {Data: spec},
			"keel.lock":     {Data: lock},
		}
		m, err := render.Render(fsys)
		if err != nil {
			var ie *render.InvalidError
			if !errors.As(err, &ie) {
				t.Fatalf("Render returned a non-validation error for in-memory input: %v", err)
			}
			for _, d := range ie.Diagnostics {
				if d.Pos.File == "" || d.Message == "" {
					t.Fatalf("diagnostic without a position or message: %#v", d)
				}
				if d.Pos.File == "apps/x.yaml" && d.Pos.Line > yamlLines(spec) {
					t.Fatalf("diagnostic past the end of the file: %#v", d)
				}
			}
		}
		if m == nil {
			t.Fatal("Render returned no model")
		}
	})
}

// yamlLines counts the lines of data as YAML does: a line break is \r\n,
// \n, or a \r alone (YAML 1.2, b-break), so "\r00" is two lines.
func yamlLines(data []byte) int {
	data = bytes.ReplaceAll(data, []byte("\r\n"), []byte("\n"))
	return bytes.Count(data, []byte("\n")) + bytes.Count(data, []byte("\r")) + 1
}
