package render_test

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/keel-dev/keel/render"
)

// The spec corpus: small cluster repositories, each the valid base below
// with one thing changed, and what Render must say about them. An invalid
// case lists every error Render must report, in order, each with its exact
// position and field path; a valid case checks the rendered model.

// corpusBase is the smallest valid repository: the Cluster and two nodes
// with explicit subnets, so that the addresses used by the cases are
// predictable. n1 is labelled disk=ssd.
var corpusBase = map[string]string{
	"cluster.yaml": `apiVersion: keel/v1
kind: Cluster
metadata:
  name: test
spec:
  podCIDR: 10.200.0.0/16
  serviceCIDR: 10.201.0.0/16
`,
	"nodes/n1.yaml": `apiVersion: keel/v1
kind: Node
metadata:
  name: n1
  labels:
    disk: ssd
spec:
  address: 192.0.2.11
  podCIDR: 10.200.1.0/24
`,
	"nodes/n2.yaml": `apiVersion: keel/v1
kind: Node
metadata:
  name: n2
spec:
  address: 192.0.2.12
  podCIDR: 10.200.2.0/24
`,
}

// corpusWeb is a valid Service, for cases that need a backend.
const corpusWeb = `apiVersion: keel/v1
kind: Service
metadata:
  name: web
spec:
  port: 8080
  template:
    image: base/14.2-web
`

// corpusDB is a valid stateful Service with two replicas.
const corpusDB = `apiVersion: keel/v1
kind: Service
metadata:
  name: db
spec:
  replicas: 2
  port: 5432
  template:
    image: base/14.2-postgres
    volumes:
      - name: data
        mountPath: /var/db/postgres
`

// corpusNode3 is a valid node without an explicit subnet.
const corpusNode3 = `apiVersion: keel/v1
kind: Node
metadata:
  name: n3
spec:
  address: 192.0.2.13
`

// corpusFS returns the base repository with files added or replaced and
// the files in drop removed.
func corpusFS(files map[string]string, drop []string) fstest.MapFS {
	fsys := fstest.MapFS{}
	for name, data := range corpusBase {
		fsys[name] = &fstest.MapFile{Data: []byte(data)}
	}
	for name, data := range files {
		fsys[name] = &fstest.MapFile{Data: []byte(data)}
	}
	for _, name := range drop {
		delete(fsys, name)
	}
	return fsys
}

// corpusDiag is an expected error: its exact position and field path, and a
// part of its message.
type corpusDiag struct {
	file      string
	line, col int
	field     string
	msg       string
}

func (w corpusDiag) String() string {
	return fmt.Sprintf("%s:%d:%d: %s: ...%s...", w.file, w.line, w.col, w.field, w.msg)
}

func (w corpusDiag) matches(d render.Diagnostic) bool {
	return d.Severity == render.SeverityError &&
		d.Pos == render.Position{File: w.file, Line: w.line, Column: w.col} &&
		d.Field == w.field && strings.Contains(d.Message, w.msg)
}

type corpusInvalidCase struct {
	name  string
	files map[string]string
	drop  []string
	want  []corpusDiag
}

// corpusLong is a name of n letters c.
func corpusLong(c string, n int) string { return strings.Repeat(c, n) }

// corpusServices is a file of n Services s0 … s(n-1) of the given replicas,
// 9 lines each: the replicas of Service i are on line 9i+7.
func corpusServices(n, replicas int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "---\napiVersion: keel/v1\nkind: Service\nmetadata:\n  name: s%d\nspec:\n  replicas: %d\n  port: 80\n  template: {image: base/14.2-web}\n", i, replicas)
	}
	return b.String()
}

// corpusAliasBomb is a Jail whose env is a mapping of keys entries, repeated
// by aliases times aliases in its volumes.
func corpusAliasBomb(keys, aliases int) string {
	var b strings.Builder
	b.WriteString("apiVersion: keel/v1\nkind: Jail\nmetadata:\n  name: tools\nspec:\n  env: &env {")
	for i := range keys {
		fmt.Fprintf(&b, "K%d: v, ", i)
	}
	b.WriteString("}\n  volumes: [")
	for range aliases {
		b.WriteString("*env, ")
	}
	b.WriteString("]\n")
	return b.String()
}

// corpusDeepBlock is a block mapping a: a: … of n levels, the first key
// indented by indent spaces and each level two more.
func corpusDeepBlock(n, indent int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(strings.Repeat(" ", indent+2*i) + "a:\n")
	}
	return b.String()
}

var corpusInvalid = []corpusInvalidCase{
	// Strict decoding: unknown fields, wrong types, duplicate keys, syntax.
	{
		name: "unknown field suggests the field meant",
		files: map[string]string{"apps/web.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: web
spec:
  replica: 2
  port: 8080
  template:
    image: base/14.2-web
`},
		want: []corpusDiag{{"apps/web.yaml", 6, 3, "spec.replica", `unknown field "replica" (did you mean "replicas"?)`}},
	},
	{
		name: "unknown field deep in a template suggests the field meant",
		files: map[string]string{"apps/web.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: web
spec:
  port: 8080
  template:
    image: base/14.2-web
    resources:
      memroy: 1G
`},
		want: []corpusDiag{{"apps/web.yaml", 10, 7, "spec.template.resources.memroy", `unknown field "memroy" (did you mean "memory"?)`}},
	},
	{
		name: "string where an integer is expected",
		files: map[string]string{"apps/web.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: web
spec:
  replicas: "3"
  port: 8080
  template:
    image: base/14.2-web
`},
		want: []corpusDiag{{"apps/web.yaml", 6, 13, "spec.replicas", `expected an integer, got the string "3"`}},
	},
	{
		name: "quoted port is one error, not also a bad port",
		files: map[string]string{"apps/web.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: web
spec:
  port: "8080"
  template:
    image: base/14.2-web
`},
		want: []corpusDiag{{"apps/web.yaml", 6, 9, "spec.port", `expected an integer, got the string "8080"`}},
	},
	{
		name: "list where a string is expected is one error, not also a missing image",
		files: map[string]string{"apps/web.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: web
spec:
  port: 8080
  template:
    image: [base/14.2-web]
`},
		want: []corpusDiag{{"apps/web.yaml", 8, 12, "spec.template.image", "expected a string, got a list"}},
	},
	{
		name: "mapping where a list is expected",
		files: map[string]string{"apps/web.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: web
spec:
  port: 8080
  template:
    image: base/14.2-web
    command: {program: /usr/local/bin/web}
`},
		want: []corpusDiag{{"apps/web.yaml", 9, 14, "spec.template.command", "expected a list, got a mapping"}},
	},
	{
		name: "integer env value must be quoted",
		files: map[string]string{"apps/web.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: web
spec:
  port: 8080
  template:
    image: base/14.2-web
    env:
      PORT: 8080
`},
		want: []corpusDiag{{"apps/web.yaml", 10, 13, "spec.template.env.PORT", `expected a string, got an integer (quote it: "8080")`}},
	},
	{
		name: "boolean label value must be quoted",
		files: map[string]string{"nodes/n1.yaml": `apiVersion: keel/v1
kind: Node
metadata:
  name: n1
  labels:
    keel.dev/ingress: true
spec:
  address: 192.0.2.11
  podCIDR: 10.200.1.0/24
`},
		want: []corpusDiag{{"nodes/n1.yaml", 6, 23, "metadata.labels.keel.dev/ingress", `expected a string, got a boolean (quote it: "true")`}},
	},
	{
		name: "yes is not a boolean",
		files: map[string]string{"nodes/n2.yaml": `apiVersion: keel/v1
kind: Node
metadata:
  name: n2
spec:
  address: 192.0.2.12
  podCIDR: 10.200.2.0/24
  schedulable: yes
`},
		want: []corpusDiag{{"nodes/n2.yaml", 8, 16, "spec.schedulable", `expected true or false, got the string "yes"`}},
	},
	{
		name: "duplicate YAML key",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
  image: base/14.2-web
`},
		want: []corpusDiag{{"jails/tools.yaml", 7, 3, "spec.image", "duplicate key (first at line 6)"}},
	},
	{
		name: "YAML merge key",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  <<: {image: base/14.2-base}
`},
		want: []corpusDiag{
			{"jails/tools.yaml", 6, 3, "spec", "YAML merge keys (<<) are not supported"},
			{"jails/tools.yaml", 6, 3, "spec.image", "an image is required"},
		},
	},
	{
		name: "YAML syntax error reports its line in a later document",
		files: map[string]string{"jails/tools.yaml": "apiVersion: keel/v1\n" +
			"kind: Jail\n" +
			"metadata:\n" +
			"  name: tools\n" +
			"spec:\n" +
			"  image: base/14.2-base\n" +
			"---\n" +
			"apiVersion: keel/v1\n" +
			"kind: Jail\n" +
			"metadata:\n" +
			"  name: bastion\n" +
			"spec:\n" +
			"\timage: base/14.2-base\n"},
		want: []corpusDiag{{"jails/tools.yaml", 13, 1, "", "invalid YAML: found character that cannot start any token"}},
	},
	{
		name: "YAML syntax error: mapping value on the same line",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
  command: /bin/sh -c: exit
`},
		want: []corpusDiag{{"jails/tools.yaml", 7, 22, "", "invalid YAML: mapping values are not allowed in this context"}},
	},

	// Documents that are not Keel's, and where documents belong.
	{
		name: "non-keel apiVersion says how to ignore the file",
		files: map[string]string{"deploy/k8s.yaml": `apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
`},
		want: []corpusDiag{{"deploy/k8s.yaml", 1, 13, "apiVersion", `"apps/v1" is not a Keel apiVersion (want keel/v1); if deploy/k8s.yaml is not a Keel spec, list it in .keelignore to skip it`}},
	},
	{
		name: "YAML without apiVersion says how to ignore the file",
		files: map[string]string{"docker-compose.yaml": `services:
  web:
    image: nginx
`},
		want: []corpusDiag{{"docker-compose.yaml", 1, 1, "apiVersion", "list it in .keelignore to skip it"}},
	},
	{
		name:  "foreign YAML not listed in .keelignore",
		files: corpusIgnored,
		drop:  []string{".keelignore"},
		want: []corpusDiag{
			{"ci/checks.yml", 1, 1, "apiVersion", "if ci/checks.yml is not a Keel spec, list it in .keelignore to skip it"},
			{"deploy/web.k8s.yaml", 1, 13, "apiVersion", "if deploy/web.k8s.yaml is not a Keel spec, list it in .keelignore to skip it"},
			{"docker-compose.yaml", 1, 1, "apiVersion", "if docker-compose.yaml is not a Keel spec, list it in .keelignore to skip it"},
		},
	},
	{
		name: "top-level list says how to ignore the file",
		files: map[string]string{"ansible/site.yml": `- hosts: all
  roles: [keel]
`},
		want: []corpusDiag{{"ansible/site.yml", 1, 1, "", "expected a Keel document (a mapping with apiVersion, kind, metadata and spec), got a list; if ansible/site.yml is not a Keel spec, list it in .keelignore"}},
	},
	{
		name: "keel/v2 is not read by this version",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v2
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
`},
		want: []corpusDiag{{"jails/tools.yaml", 1, 13, "apiVersion", `"keel/v2" is not supported by this version of keel (it reads keel/v1)`}},
	},
	{
		name: "unknown kind lists the kinds",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Deployment
metadata:
  name: tools
`},
		want: []corpusDiag{{"jails/tools.yaml", 2, 7, "kind", `"Deployment" is not a kind of keel/v1 (want one of Cluster, Node, Jail, Service, Ingress)`}},
	},
	{
		name: "misspelt kind suggests the kind meant",
		files: map[string]string{"apps/web.yaml": `apiVersion: keel/v1
kind: Servcie
metadata:
  name: web
`},
		want: []corpusDiag{{"apps/web.yaml", 2, 7, "kind", `"Servcie" is not a kind of keel/v1 (did you mean "Service"?)`}},
	},
	{
		name: "missing cluster.yaml",
		drop: []string{"cluster.yaml"},
		want: []corpusDiag{{"cluster.yaml", 0, 0, "", "missing: there is no cluster.yaml here, so this is not a cluster repository and nothing else was read (is --repo the right directory?)"}},
	},
	{
		name: "two Cluster documents",
		files: map[string]string{"cluster.yaml": `apiVersion: keel/v1
kind: Cluster
metadata:
  name: test
---
apiVersion: keel/v1
kind: Cluster
metadata:
  name: prod
`},
		want: []corpusDiag{{"cluster.yaml", 6, 1, "kind", "a second Cluster document (the first is at cluster.yaml:1:1); a repository has exactly one"}},
	},
	{
		name: "Cluster document outside cluster.yaml",
		files: map[string]string{"cluster.yaml": "# moved to config/\n", "config/cluster.yaml": `apiVersion: keel/v1
kind: Cluster
metadata:
  name: test
`},
		want: []corpusDiag{{"config/cluster.yaml", 2, 7, "kind", "the Cluster document belongs in cluster.yaml at the repository root"}},
	},
	{
		name: "Node document outside nodes/",
		files: map[string]string{"inventory/n3.yaml": `apiVersion: keel/v1
kind: Node
metadata:
  name: n3
spec:
  address: 192.0.2.13
  podCIDR: 10.200.3.0/24
`},
		want: []corpusDiag{{"inventory/n3.yaml", 4, 9, "metadata.name", `node "n3" belongs in nodes/n3.yaml (one file per node, named after it)`}},
	},
	{
		name: "Node named differently from its file",
		files: map[string]string{"nodes/n3.yaml": `apiVersion: keel/v1
kind: Node
metadata:
  name: n4
spec:
  address: 192.0.2.13
  podCIDR: 10.200.3.0/24
`},
		want: []corpusDiag{{"nodes/n3.yaml", 4, 9, "metadata.name", `node "n4" belongs in nodes/n4.yaml`}},
	},

	// Names: one DNS label each, one flat namespace for instances.
	{
		name: "uppercase Jail name",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: Tools
spec:
  image: base/14.2-base
`},
		want: []corpusDiag{{"jails/tools.yaml", 4, 9, "metadata.name", `"Tools" is not a valid name (lowercase letters, digits and '-'`}},
	},
	{
		name: "name written as a number is one error",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: 2024
spec:
  image: base/14.2-base
`},
		want: []corpusDiag{{"jails/tools.yaml", 4, 9, "metadata.name", `expected a string, got an integer (quote it: "2024")`}},
	},
	{
		name: "underscore in a Service name",
		files: map[string]string{"apps/web.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: my_web
spec:
  port: 8080
  template:
    image: base/14.2-web
`},
		want: []corpusDiag{{"apps/web.yaml", 4, 9, "metadata.name", `"my_web" is not a valid name`}},
	},
	{
		name: "leading dash in an Ingress name",
		files: map[string]string{
			"apps/web.yaml": corpusWeb,
			"ingress/www.yaml": `apiVersion: keel/v1
kind: Ingress
metadata:
  name: -www
spec:
  host: www.example.com
  backend:
    service: web
  tls:
    email: ops@example.com
`,
		},
		want: []corpusDiag{{"ingress/www.yaml", 4, 9, "metadata.name", `"-www" is not a valid name`}},
	},
	{
		name: "64-character Jail name",
		files: map[string]string{"jails/long.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: ` + corpusLong("j", 64) + `
spec:
  image: base/14.2-base
`},
		want: []corpusDiag{{"jails/long.yaml", 4, 9, "metadata.name", fmt.Sprintf("%q is longer than 63 characters", corpusLong("j", 64))}},
	},
	{
		name: "replica name too long for the last replica only",
		files: map[string]string{"apps/long.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: ` + corpusLong("w", 61) + `
spec:
  replicas: 11
  port: 8080
  template:
    image: base/14.2-web
`},
		want: []corpusDiag{{"apps/long.yaml", 4, 9, "metadata.name", fmt.Sprintf("replica name %q would be longer than 63 characters", corpusLong("w", 61)+"-10")}},
	},
	{
		name: "Jail named like a Service replica",
		files: map[string]string{
			"apps/web.yaml": corpusWeb,
			"jails/web-0.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: web-0
spec:
  image: base/14.2-base
`,
		},
		want: []corpusDiag{{"apps/web.yaml", 4, 9, "metadata.name", `duplicate name "web-0" (replica 0 of Service web): it is also declared at jails/web-0.yaml:4:9 (Jails and Service replicas share one namespace)`}},
	},
	{
		name: "duplicate Jail in a multi-document file",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
---
apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-web
`},
		want: []corpusDiag{{"jails/tools.yaml", 11, 9, "metadata.name", `duplicate name "tools": it is also declared at jails/tools.yaml:4:9`}},
	},
	{
		name: "duplicate Service",
		files: map[string]string{
			"apps/web.yaml": corpusWeb,
			"apps/web2.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: web
spec:
  port: 8081
  template:
    image: base/14.2-web
`,
		},
		want: []corpusDiag{{"apps/web2.yaml", 4, 9, "metadata.name", `duplicate Service "web" (also at apps/web.yaml:4:9)`}},
	},
	{
		name: "duplicate Ingress",
		files: map[string]string{
			"apps/web.yaml": corpusWeb,
			"ingress/a.yaml": `apiVersion: keel/v1
kind: Ingress
metadata:
  name: www
spec:
  host: a.example.com
  backend:
    service: web
  tls:
    email: ops@example.com
`,
			"ingress/b.yaml": `apiVersion: keel/v1
kind: Ingress
metadata:
  name: www
spec:
  host: b.example.com
  backend:
    service: web
  tls:
    email: ops@example.com
`,
		},
		want: []corpusDiag{{"ingress/b.yaml", 4, 9, "metadata.name", `duplicate Ingress "www" (also at ingress/a.yaml:4:9)`}},
	},
	{
		name: "duplicate Node in a .yaml and a .yml file",
		files: map[string]string{"nodes/n1.yml": `apiVersion: keel/v1
kind: Node
metadata:
  name: n1
spec:
  address: 192.0.2.21
  podCIDR: 10.200.21.0/24
`},
		want: []corpusDiag{{"nodes/n1.yml", 4, 9, "metadata.name", `duplicate node "n1" (also at nodes/n1.yaml:4:9)`}},
	},

	// Volumes and mount paths.
	{
		name: "duplicate volume in one Jail",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
  volumes:
    - name: data
      mountPath: /var/db
    - name: data
      mountPath: /var/log
`},
		want: []corpusDiag{{"jails/tools.yaml", 10, 13, "spec.volumes[1].name", `duplicate volume "data" (also volumes[0])`}},
	},
	{
		name: "volume name shared by two Jails on no node",
		files: map[string]string{
			"jails/a.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: a
spec:
  image: base/14.2-base
  volumes:
    - name: data
      mountPath: /var/db
`,
			"jails/b.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: b
spec:
  image: base/14.2-base
  volumes:
    - name: data
      mountPath: /var/db
`,
		},
		want: []corpusDiag{{"jails/b.yaml", 8, 13, "spec.volumes[0].name", `volume "data" is also a volume of a: Jails share a volume only when spec.node (or the address) pins both to the same node (b: no node, a: no node)`}},
	},
	{
		name: "volume shared by a Jail pinned to a node and one that is not",
		files: map[string]string{
			"jails/a.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: a
spec:
  image: base/14.2-base
  node: n1
  volumes:
    - name: data
      mountPath: /var/db
`,
			"jails/b.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: b
spec:
  image: base/14.2-base
  nodeSelector: {disk: ssd}
  volumes:
    - name: data
      mountPath: /var/db
`,
		},
		want: []corpusDiag{{"jails/b.yaml", 9, 13, "spec.volumes[0].name", `volume "data" is also a volume of a: Jails share a volume only when spec.node (or the address) pins both to the same node (b: no node, a: node n1)`}},
	},
	{
		name: "volume shared by Jails pinned to different nodes",
		files: map[string]string{
			"jails/a.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: a
spec:
  image: base/14.2-base
  node: n1
  volumes:
    - {name: data, mountPath: /var/db}
`,
			"jails/b.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: b
spec:
  image: base/14.2-base
  network:
    address: 10.200.2.10/24
  volumes:
    - {name: data, mountPath: /var/db}
`,
		},
		want: []corpusDiag{{"jails/b.yaml", 10, 14, "spec.volumes[0].name", `volume "data" is also a volume of a: Jails share a volume only when spec.node (or the address) pins both to the same node (b: node n2, a: node n1)`}},
	},
	{
		name: "volume shared on one node with different sizes",
		files: map[string]string{
			"jails/a.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: a
spec:
  image: base/14.2-base
  node: n1
  volumes:
    - {name: data, mountPath: /var/db, size: 10G}
`,
			"jails/b.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: b
spec:
  image: base/14.2-base
  node: n1
  volumes:
    - name: data
      mountPath: /srv/data
      size: 20G
`,
		},
		want: []corpusDiag{{"jails/b.yaml", 11, 13, "spec.volumes[0].size", `volume "data" is also a volume of a with size 10G, here size 20G: Jails that share a volume must give it the same size`}},
	},
	{
		name: "volume shared on one node, sized by one Jail only",
		files: map[string]string{
			"jails/a.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: a
spec:
  image: base/14.2-base
  node: n1
  volumes:
    - {name: data, mountPath: /var/db, size: 10G}
`,
			"jails/b.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: b
spec:
  image: base/14.2-base
  node: n1
  volumes:
    - name: data
      mountPath: /srv/data
`,
		},
		want: []corpusDiag{{"jails/b.yaml", 9, 13, "spec.volumes[0].name", `volume "data" is also a volume of a with size 10G, here no size: Jails that share a volume must give it the same size`}},
	},
	{
		name: "volume shared with a Jail whose address is wrong is one error, not also an unpinned sharer",
		files: map[string]string{
			"jails/a.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: a
spec:
  image: base/14.2-base
  network:
    address: 10.200.9.10
  volumes:
    - {name: data, mountPath: /var/db}
`,
			"jails/b.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: b
spec:
  image: base/14.2-base
  network:
    address: 10.200.1.255/24
  volumes:
    - {name: data, mountPath: /var/db}
`,
		},
		want: []corpusDiag{
			{"jails/a.yaml", 8, 14, "spec.network.address", "10.200.9.10 is in no node's subnet"},
			{"jails/b.yaml", 8, 14, "spec.network.address", `"10.200.1.255/24" is the broadcast address of 10.200.1.0/24, not a host address`},
		},
	},
	{
		name: "replica's volume named like a Jail's on the same node",
		files: map[string]string{
			"apps/db.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: db
spec:
  replicas: 1
  port: 5432
  template:
    image: base/14.2-postgres
    node: n1
    volumes:
      - name: data
        mountPath: /var/db/postgres
`,
			"jails/backup.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: backup
spec:
  image: base/14.2-base
  node: n1
  volumes:
    - name: db-0-data
      mountPath: /backup
`,
		},
		want: []corpusDiag{{"apps/db.yaml", 12, 15, "spec.template.volumes[0].name", `volume "db-0-data" is also a volume of backup: only Jails pinned to one node may share a volume, never a Service's replica`}},
	},
	{
		name: "Jail volume named like a replica's expanded volume",
		files: map[string]string{
			"apps/db.yaml": corpusDB,
			"jails/backup.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: backup
spec:
  image: base/14.2-base
  volumes:
    - name: db-0-data
      mountPath: /backup
`,
		},
		want: []corpusDiag{{"apps/db.yaml", 11, 15, "spec.template.volumes[0].name", `volume "db-0-data" is also a volume of backup`}},
	},
	{
		name: "relative mount path",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
  volumes:
    - name: data
      mountPath: var/db
`},
		want: []corpusDiag{{"jails/tools.yaml", 9, 18, "spec.volumes[0].mountPath", `"var/db" is not an absolute path`}},
	},
	{
		name: "mount path on the jail's root",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
  volumes:
    - name: data
      mountPath: /
`},
		want: []corpusDiag{{"jails/tools.yaml", 9, 18, "spec.volumes[0].mountPath", "cannot mount a volume on the jail's root"}},
	},
	{
		name: "mount path climbing with ..",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
  volumes:
    - name: data
      mountPath: /var/../etc
`},
		want: []corpusDiag{{"jails/tools.yaml", 9, 18, "spec.volumes[0].mountPath", `"/var/../etc" contains ".."`}},
	},
	{
		name: "duplicate mount path after cleaning",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
  volumes:
    - name: data
      mountPath: /var/db
    - name: logs
      mountPath: /var//db/
`},
		want: []corpusDiag{{"jails/tools.yaml", 11, 18, "spec.volumes[1].mountPath", `"/var//db/" is also the mount path of volumes[0]`}},
	},
	{
		name: "volume size with a fraction",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
  volumes:
    - name: data
      mountPath: /var/db
      size: 1.5G
`},
		want: []corpusDiag{{"jails/tools.yaml", 10, 13, "spec.volumes[0].size", `"1.5G" is not a size (want e.g. 512M, 2G)`}},
	},

	// Resources.
	{
		name: "memory with an unknown unit",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
  resources:
    memory: 512Q
`},
		want: []corpusDiag{{"jails/tools.yaml", 8, 13, "spec.resources.memory", `"512Q" is not a size (want e.g. 512M, 2G)`}},
	},
	{
		name: "cpu zero",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
  resources:
    cpu: "0"
`},
		want: []corpusDiag{{"jails/tools.yaml", 8, 10, "spec.resources.cpu", `"0" is less than the smallest CPU amount, 10m (1% of a core)`}},
	},
	{
		name: "cpu not a number",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
  resources:
    cpu: abc
`},
		want: []corpusDiag{{"jails/tools.yaml", 8, 10, "spec.resources.cpu", `"abc" is not a CPU amount (want cores such as 2 or 0.5, or millicores such as 500m)`}},
	},
	{
		name: "cpu one millicore is below the smallest amount",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
  resources:
    cpu: 0.001
`},
		want: []corpusDiag{{"jails/tools.yaml", 8, 10, "spec.resources.cpu", `"0.001" is less than the smallest CPU amount, 10m`}},
	},
	{
		name: "cpu finer than a millicore",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
  resources:
    cpu: 1.0005
`},
		want: []corpusDiag{{"jails/tools.yaml", 8, 10, "spec.resources.cpu", `"1.0005" is finer than a millicore`}},
	},

	// Cluster settings.
	{
		name:  "duration without a unit",
		files: map[string]string{"cluster.yaml": corpusBase["cluster.yaml"] + "  livenessTTL: 30\n"},
		want:  []corpusDiag{{"cluster.yaml", 8, 16, "spec.livenessTTL", `"30" is not a duration (want e.g. 30s, 1m)`}},
	},
	{
		name:  "negative duration",
		files: map[string]string{"cluster.yaml": corpusBase["cluster.yaml"] + "  reportInterval: -5s\n"},
		want:  []corpusDiag{{"cluster.yaml", 8, 19, "spec.reportInterval", `"-5s": a duration must be more than zero`}},
	},
	{
		name:  "reportInterval more than a third of livenessTTL",
		files: map[string]string{"cluster.yaml": corpusBase["cluster.yaml"] + "  livenessTTL: 30s\n  reportInterval: 11s\n"},
		want:  []corpusDiag{{"cluster.yaml", 9, 19, "spec.reportInterval", "11s is more than a third of livenessTTL 30s"}},
	},
	{
		name:  "gossip without a port",
		files: map[string]string{"cluster.yaml": corpusBase["cluster.yaml"] + "  gossip: {}\n"},
		want:  []corpusDiag{{"cluster.yaml", 8, 11, "spec.gossip.port", "0 is not a port (1-65535)"}},
	},
	{
		name:  "gossip port out of range",
		files: map[string]string{"cluster.yaml": corpusBase["cluster.yaml"] + "  gossip:\n    port: 70000\n"},
		want:  []corpusDiag{{"cluster.yaml", 9, 11, "spec.gossip.port", "70000 is not a port (1-65535)"}},
	},
	{
		name:  "gossip with a reportInterval over a third of its livenessTTL",
		files: map[string]string{"cluster.yaml": corpusBase["cluster.yaml"] + "  gossip: {port: 7946}\n  reportInterval: 2m\n"},
		want:  []corpusDiag{{"cluster.yaml", 9, 19, "spec.reportInterval", "2m0s is more than a third of livenessTTL 3m0s"}},
	},
	{
		name:  "reportInterval more than a third of the default livenessTTL",
		files: map[string]string{"cluster.yaml": corpusBase["cluster.yaml"] + "  reportInterval: 15s\n"},
		want:  []corpusDiag{{"cluster.yaml", 8, 19, "spec.reportInterval", "15s is more than a third of livenessTTL 30s"}},
	},
	{
		name: "serviceCIDR overlaps podCIDR",
		files: map[string]string{"cluster.yaml": `apiVersion: keel/v1
kind: Cluster
metadata:
  name: test
spec:
  podCIDR: 10.200.0.0/16
  serviceCIDR: 10.200.128.0/17
`},
		want: []corpusDiag{{"cluster.yaml", 7, 16, "spec.serviceCIDR", "10.200.128.0/17 overlaps podCIDR 10.200.0.0/16"}},
	},
	{
		name: "CIDR with host bits",
		files: map[string]string{"cluster.yaml": `apiVersion: keel/v1
kind: Cluster
metadata:
  name: test
spec:
  podCIDR: 10.200.1.0/16
  serviceCIDR: 10.201.0.0/16
`},
		want: []corpusDiag{{"cluster.yaml", 6, 12, "spec.podCIDR", `"10.200.1.0/16" has host bits set (did you mean 10.200.0.0/16?)`}},
	},
	{
		name:  "cluster bridge not keel<N>",
		files: map[string]string{"cluster.yaml": corpusBase["cluster.yaml"] + "  bridge: br0\n"},
		want:  []corpusDiag{{"cluster.yaml", 8, 11, "spec.bridge", `"br0" is not a Keel bridge name (want keel<N>, e.g. keel0)`}},
	},
	{
		name: "Jail bridge not keel<N>",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
  network:
    bridge: bridge0
`},
		want: []corpusDiag{{"jails/tools.yaml", 8, 13, "spec.network.bridge", `"bridge0" is not a Keel bridge name`}},
	},
	{
		name:  "reportRefPrefix under refs/heads/",
		files: map[string]string{"cluster.yaml": corpusBase["cluster.yaml"] + "  reportRefPrefix: refs/heads/reports/\n"},
		want:  []corpusDiag{{"cluster.yaml", 8, 20, "spec.reportRefPrefix", `"refs/heads/reports/" would make reports branches or tags`}},
	},
	{
		name:  "reportRefPrefix over the certificate refs",
		files: map[string]string{"cluster.yaml": corpusBase["cluster.yaml"] + "  reportRefPrefix: refs/keel/\n"},
		want:  []corpusDiag{{"cluster.yaml", 8, 20, "spec.reportRefPrefix", `"refs/keel/" overlaps refs/keel/certs/`}},
	},
	{
		name:  "reportRefPrefix under the certificate refs",
		files: map[string]string{"cluster.yaml": corpusBase["cluster.yaml"] + "  reportRefPrefix: refs/keel/certs/reports/\n"},
		want:  []corpusDiag{{"cluster.yaml", 8, 20, "spec.reportRefPrefix", `"refs/keel/certs/reports/" overlaps refs/keel/certs/`}},
	},

	// The inventory.
	{
		name: "node podCIDR not a /24",
		files: map[string]string{"nodes/n2.yaml": `apiVersion: keel/v1
kind: Node
metadata:
  name: n2
spec:
  address: 192.0.2.12
  podCIDR: 10.200.2.0/25
`},
		want: []corpusDiag{{"nodes/n2.yaml", 7, 12, "spec.podCIDR", "10.200.2.0/25: a node's subnet is a /24"}},
	},
	{
		name: "node podCIDR outside the cluster podCIDR",
		files: map[string]string{"nodes/n2.yaml": `apiVersion: keel/v1
kind: Node
metadata:
  name: n2
spec:
  address: 192.0.2.12
  podCIDR: 10.199.2.0/24
`},
		want: []corpusDiag{{"nodes/n2.yaml", 7, 12, "spec.podCIDR", "10.199.2.0/24 is outside the cluster's podCIDR 10.200.0.0/16"}},
	},
	{
		name: "overlapping explicit node podCIDRs",
		files: map[string]string{"nodes/n2.yaml": `apiVersion: keel/v1
kind: Node
metadata:
  name: n2
spec:
  address: 192.0.2.12
  podCIDR: 10.200.1.0/24
`},
		want: []corpusDiag{{"nodes/n2.yaml", 7, 12, "spec.podCIDR", "10.200.1.0/24 overlaps node n1's podCIDR 10.200.1.0/24"}},
	},
	{
		name: "node address missing",
		files: map[string]string{"nodes/n2.yaml": `apiVersion: keel/v1
kind: Node
metadata:
  name: n2
spec:
  podCIDR: 10.200.2.0/24
`},
		want: []corpusDiag{{"nodes/n2.yaml", 6, 3, "spec.address", "required: the address other nodes route this node's subnet to"}},
	},
	{
		name: "node address written empty",
		files: map[string]string{"nodes/n2.yaml": `apiVersion: keel/v1
kind: Node
metadata:
  name: n2
spec:
  address:
  podCIDR: 10.200.2.0/24
`},
		want: []corpusDiag{{"nodes/n2.yaml", 6, 11, "spec.address", "required: the address other nodes route this node's subnet to"}},
	},
	{
		name: "node address with a prefix length is one error",
		files: map[string]string{"nodes/n2.yaml": `apiVersion: keel/v1
kind: Node
metadata:
  name: n2
spec:
  address: 192.0.2.12/24
  podCIDR: 10.200.2.0/24
`},
		want: []corpusDiag{{"nodes/n2.yaml", 6, 12, "spec.address", `"192.0.2.12/24": want a bare address such as 10.200.11.5, without a prefix length`}},
	},
	{
		name: "duplicate node address",
		files: map[string]string{"nodes/n2.yaml": `apiVersion: keel/v1
kind: Node
metadata:
  name: n2
spec:
  address: 192.0.2.11
  podCIDR: 10.200.2.0/24
`},
		want: []corpusDiag{{"nodes/n2.yaml", 6, 12, "spec.address", "192.0.2.11 is also the address of node n1"}},
	},
	{
		name: "node address inside the podCIDR",
		files: map[string]string{"nodes/n2.yaml": `apiVersion: keel/v1
kind: Node
metadata:
  name: n2
spec:
  address: 10.200.2.5
  podCIDR: 10.200.2.0/24
`},
		want: []corpusDiag{{"nodes/n2.yaml", 6, 12, "spec.address", "10.200.2.5 is inside the cluster's podCIDR or serviceCIDR"}},
	},
	{
		name:  "node reportKey that is not an SSH public key",
		files: map[string]string{"nodes/n2.yaml": corpusBase["nodes/n2.yaml"] + "  reportKey: ssh-ed25519 not-base64!\n"},
		want:  []corpusDiag{{"nodes/n2.yaml", 8, 14, "spec.reportKey", "not an SSH public key"}},
	},

	// Addresses and placement.
	{
		name: "Jail address in no node's subnet",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
  network:
    address: 10.200.9.10
`},
		want: []corpusDiag{{"jails/tools.yaml", 8, 14, "spec.network.address", "10.200.9.10 is in no node's subnet; an explicit address picks its node"}},
	},
	{
		name: "Jail address contradicting spec.node",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
  node: n2
  network:
    address: 10.200.1.10
`},
		want: []corpusDiag{{"jails/tools.yaml", 9, 14, "spec.network.address", "10.200.1.10 is in node n1's subnet 10.200.1.0/24, but spec.node is n2"}},
	},
	{
		name: "Jail address is the bridge's .1",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
  network:
    address: 10.200.1.1
`},
		want: []corpusDiag{{"jails/tools.yaml", 8, 14, "spec.network.address", "10.200.1.1 is the bridge address of node n1's subnet 10.200.1.0/24 (.1 is reserved)"}},
	},
	{
		name: "two Jails with the same address",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: a
spec:
  image: base/14.2-base
  network:
    address: 10.200.1.10
---
apiVersion: keel/v1
kind: Jail
metadata:
  name: b
spec:
  image: base/14.2-base
  network:
    address: 10.200.1.10
`},
		want: []corpusDiag{{"jails/tools.yaml", 17, 14, "spec.network.address", "10.200.1.10 is also the address of a"}},
	},
	{
		name: "Jail address in CIDR form with a prefix that is not the node's subnet",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
  network:
    address: 10.200.1.10/16
`},
		want: []corpusDiag{{"jails/tools.yaml", 8, 14, "spec.network.address", "10.200.1.10/16: the prefix length must be that of node n1's subnet 10.200.1.0/24 (write 10.200.1.10/24, or the bare address 10.200.1.10)"}},
	},
	{
		name: "Jail address in CIDR form as a /32",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
  network:
    address: 10.200.2.7/32
`},
		want: []corpusDiag{{"jails/tools.yaml", 8, 14, "spec.network.address", "10.200.2.7/32: the prefix length must be that of node n2's subnet 10.200.2.0/24 (write 10.200.2.7/24, or the bare address 10.200.2.7)"}},
	},
	{
		name: "Jail address in CIDR form that is its network's address",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
  network:
    address: 10.200.1.0/24
`},
		want: []corpusDiag{{"jails/tools.yaml", 8, 14, "spec.network.address", "\"10.200.1.0/24\" is the network address of 10.200.1.0/24, not a host address"}},
	},
	{
		name: "Jail address in CIDR form that is its network's broadcast address",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
  network:
    address: 10.200.1.255/24
`},
		want: []corpusDiag{{"jails/tools.yaml", 8, 14, "spec.network.address", "\"10.200.1.255/24\" is the broadcast address of 10.200.1.0/24, not a host address"}},
	},
	{
		name: "Jail address in CIDR form that is the broadcast address of a smaller prefix",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
  network:
    address: 10.200.1.127/25
`},
		want: []corpusDiag{{"jails/tools.yaml", 8, 14, "spec.network.address", "\"10.200.1.127/25\" is the broadcast address of 10.200.1.0/25, not a host address"}},
	},
	{
		name: "Jail address with a prefix length out of range",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
  network:
    address: 10.200.1.10/33
`},
		want: []corpusDiag{{"jails/tools.yaml", 8, 14, "spec.network.address", "\"10.200.1.10/33\" is not an address (want a bare address such as 10.200.11.5, or one with its node's prefix length such as 10.200.11.5/24)"}},
	},
	{
		name: "Jail address with garbage after the slash",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
  network:
    address: 10.200.1.10/24x
`},
		want: []corpusDiag{{"jails/tools.yaml", 8, 14, "spec.network.address", "\"10.200.1.10/24x\" is not an address (want a bare address such as 10.200.11.5, or one with its node's prefix length such as 10.200.11.5/24)"}},
	},
	{
		name: "Jail address with an empty prefix length",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
  network:
    address: 10.200.1.10/
`},
		want: []corpusDiag{{"jails/tools.yaml", 8, 14, "spec.network.address", "\"10.200.1.10/\" is not an address"}},
	},
	{
		name: "Jail address in IPv6 CIDR form",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
  network:
    address: fd00::5/64
`},
		want: []corpusDiag{{"jails/tools.yaml", 8, 14, "spec.network.address", "\"fd00::5/64\": only IPv4 addresses are supported"}},
	},
	{
		name: "Jail address in CIDR form in no node's subnet",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
  network:
    address: 10.200.9.10/24
`},
		want: []corpusDiag{{"jails/tools.yaml", 8, 14, "spec.network.address", "10.200.9.10 is in no node's subnet; an explicit address picks its node"}},
	},
	{
		name: "Jail address in CIDR form contradicting spec.node",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
  node: n2
  network:
    address: 10.200.1.10/24
`},
		want: []corpusDiag{{"jails/tools.yaml", 9, 14, "spec.network.address", "10.200.1.10 is in node n1's subnet 10.200.1.0/24, but spec.node is n2"}},
	},
	{
		name: "network.address in CIDR form in a Service template",
		files: map[string]string{"apps/web.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: web
spec:
  port: 8080
  template:
    image: base/14.2-web
    network:
      address: 10.200.1.10/24
`},
		want: []corpusDiag{{"apps/web.yaml", 10, 16, "spec.template.network.address", "not allowed in a Service template: each replica gets its own address"}},
	},
	{
		name: "two Jails with the same address, one in CIDR form",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: a
spec:
  image: base/14.2-base
  network:
    address: 10.200.1.10
---
apiVersion: keel/v1
kind: Jail
metadata:
  name: b
spec:
  image: base/14.2-base
  network:
    address: 10.200.1.10/24
`},
		want: []corpusDiag{{"jails/tools.yaml", 17, 14, "spec.network.address", "10.200.1.10 is also the address of a"}},
	},
	{
		name: "spec.node naming an unknown node",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
  node: n3
`},
		want: []corpusDiag{{"jails/tools.yaml", 7, 9, "spec.node", `node "n3" is not in the inventory (nodes/)`}},
	},
	{
		name: "spec.node not matching spec.nodeSelector",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
  node: n2
  nodeSelector:
    disk: ssd
`},
		want: []corpusDiag{{"jails/tools.yaml", 7, 9, "spec.node", `node "n2" does not match spec.nodeSelector`}},
	},
	{
		name: "network.address in a Service template",
		files: map[string]string{"apps/web.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: web
spec:
  port: 8080
  template:
    image: base/14.2-web
    network:
      address: 10.200.1.10
`},
		want: []corpusDiag{{"apps/web.yaml", 10, 16, "spec.template.network.address", "not allowed in a Service template: each replica gets its own address"}},
	},

	// Ingresses.
	{
		name: "unknown backend Service suggests the Service meant",
		files: map[string]string{
			"apps/web.yaml": corpusWeb,
			"ingress/www.yaml": `apiVersion: keel/v1
kind: Ingress
metadata:
  name: www
spec:
  host: www.example.com
  backend:
    service: wbe
  tls:
    email: ops@example.com
`,
		},
		want: []corpusDiag{{"ingress/www.yaml", 8, 14, "spec.backend.service", `Service "wbe" does not exist (did you mean "web"?)`}},
	},
	{
		name: "Ingress backend service missing",
		files: map[string]string{
			"apps/web.yaml": corpusWeb,
			"ingress/www.yaml": `apiVersion: keel/v1
kind: Ingress
metadata:
  name: www
spec:
  host: www.example.com
  backend:
    port: 8080
  tls:
    email: ops@example.com
`,
		},
		want: []corpusDiag{{"ingress/www.yaml", 8, 5, "spec.backend.service", "required: the Service to send requests to"}},
	},
	{
		name: "Ingress backend service given as a list is one error",
		files: map[string]string{
			"apps/web.yaml": corpusWeb,
			"ingress/www.yaml": `apiVersion: keel/v1
kind: Ingress
metadata:
  name: www
spec:
  host: www.example.com
  backend:
    service: [web]
  tls:
    email: ops@example.com
`,
		},
		want: []corpusDiag{{"ingress/www.yaml", 8, 14, "spec.backend.service", "expected a string, got a list"}},
	},
	{
		name: "Ingress host without a dot",
		files: map[string]string{
			"apps/web.yaml": corpusWeb,
			"ingress/www.yaml": `apiVersion: keel/v1
kind: Ingress
metadata:
  name: www
spec:
  host: localhost
  backend:
    service: web
  tls:
    email: ops@example.com
`,
		},
		want: []corpusDiag{{"ingress/www.yaml", 6, 9, "spec.host", `"localhost" is not a fully qualified host name (want e.g. app.example.com)`}},
	},
	{
		name: "Ingress path not starting with a slash",
		files: map[string]string{
			"apps/web.yaml": corpusWeb,
			"ingress/www.yaml": `apiVersion: keel/v1
kind: Ingress
metadata:
  name: www
spec:
  host: www.example.com
  path: api
  backend:
    service: web
  tls:
    email: ops@example.com
`,
		},
		want: []corpusDiag{{"ingress/www.yaml", 7, 9, "spec.path", `"api" is not a URL path prefix`}},
	},
	{
		name: "Ingress backend port out of range",
		files: map[string]string{
			"apps/web.yaml": corpusWeb,
			"ingress/www.yaml": `apiVersion: keel/v1
kind: Ingress
metadata:
  name: www
spec:
  host: www.example.com
  backend:
    service: web
    port: 70000
  tls:
    email: ops@example.com
`,
		},
		want: []corpusDiag{{"ingress/www.yaml", 9, 11, "spec.backend.port", "70000 is not a TCP port (1-65535)"}},
	},
	{
		name: "bad tls.email",
		files: map[string]string{
			"apps/web.yaml": corpusWeb,
			"ingress/www.yaml": `apiVersion: keel/v1
kind: Ingress
metadata:
  name: www
spec:
  host: www.example.com
  backend:
    service: web
  tls:
    email: ops-at-example.com
`,
		},
		want: []corpusDiag{{"ingress/www.yaml", 10, 12, "spec.tls.email", `"ops-at-example.com" is not an email address (want e.g. ops@example.com)`}},
	},
	{
		name: "duplicate Ingress host and path, the default path included",
		files: map[string]string{
			"apps/web.yaml": corpusWeb,
			"ingress/a.yaml": `apiVersion: keel/v1
kind: Ingress
metadata:
  name: www
spec:
  host: www.example.com
  path: /
  backend:
    service: web
  tls:
    email: ops@example.com
`,
			"ingress/b.yaml": `apiVersion: keel/v1
kind: Ingress
metadata:
  name: www2
spec:
  host: www.example.com
  backend:
    service: web
  tls:
    email: ops@example.com
`,
		},
		want: []corpusDiag{{"ingress/b.yaml", 6, 9, "spec.host", "www.example.com/ is also routed by Ingress www"}},
	},

	// The rest of a Jail spec or a Service.
	{
		name: "bad restartPolicy suggests the policy meant",
		files: map[string]string{"apps/web.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: web
spec:
  port: 8080
  template:
    image: base/14.2-web
    restartPolicy: always
`},
		want: []corpusDiag{{"apps/web.yaml", 9, 20, "spec.template.restartPolicy", `"always" is not a restart policy (did you mean "Always"?)`}},
	},
	{
		name: "negative replicas",
		files: map[string]string{"apps/web.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: web
spec:
  replicas: -1
  port: 8080
  template:
    image: base/14.2-web
`},
		want: []corpusDiag{{"apps/web.yaml", 6, 13, "spec.replicas", "-1: replicas cannot be negative"}},
	},
	{
		name: "port 0",
		files: map[string]string{"apps/web.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: web
spec:
  port: 0
  template:
    image: base/14.2-web
`},
		want: []corpusDiag{{"apps/web.yaml", 6, 9, "spec.port", "0 is not a TCP port (1-65535)"}},
	},
	{
		name: "port 70000",
		files: map[string]string{"apps/web.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: web
spec:
  port: 70000
  template:
    image: base/14.2-web
`},
		want: []corpusDiag{{"apps/web.yaml", 6, 9, "spec.port", "70000 is not a TCP port (1-65535)"}},
	},
	{
		name: "port missing",
		files: map[string]string{"apps/web.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: web
spec:
  template:
    image: base/14.2-web
`},
		want: []corpusDiag{{"apps/web.yaml", 6, 3, "spec.port", "required: the TCP port the replicas listen on and the VIP serves"}},
	},
	{
		name: "port written empty",
		files: map[string]string{"apps/web.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: web
spec:
  replicas: 2
  port:
  template:
    image: base/14.2-web
`},
		want: []corpusDiag{{"apps/web.yaml", 7, 8, "spec.port", "required: the TCP port the replicas listen on and the VIP serves"}},
	},
	{
		name: "tls without email",
		files: map[string]string{
			"apps/web.yaml": corpusWeb,
			"ingress/www.yaml": `apiVersion: keel/v1
kind: Ingress
metadata:
  name: www
spec:
  host: www.example.com
  backend:
    service: web
  tls:
    email:
`,
		},
		want: []corpusDiag{{"ingress/www.yaml", 10, 11, "spec.tls.email", "required: the ACME account's contact address"}},
	},
	{
		name: "image not under base/",
		files: map[string]string{"apps/web.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: web
spec:
  port: 8080
  template:
    image: freebsd/14.2
`},
		want: []corpusDiag{{"apps/web.yaml", 8, 12, "spec.template.image", `"freebsd/14.2" is not a valid image (want base/<name>, e.g. base/14.2-web)`}},
	},
	{
		name: "image climbing out of base/ with ..",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/../etc
`},
		want: []corpusDiag{{"jails/tools.yaml", 6, 10, "spec.image", `"base/../etc" is not a valid image (each part after base/ is lowercase letters`}},
	},
	{
		name: "image missing",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  command: [/bin/sh]
`},
		want: []corpusDiag{{"jails/tools.yaml", 6, 3, "spec.image", "an image is required (e.g. base/14.2-web)"}},
	},
	{
		name: "OCI image pinned by tag only",
		files: map[string]string{"apps/web.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: web
spec:
  port: 8080
  template:
    image: oci://registry.example.org/team/web:v2
`},
		want: []corpusDiag{{"apps/web.yaml", 8, 12, "spec.template.image", `"oci://registry.example.org/team/web:v2" is pinned by tag (v2), which can move: pin it by digest: oci://<registry>/<repository>@sha256:<64 hex digits>`}},
	},
	{
		name: "OCI image without a registry",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: oci://team/web@sha256:` + strings.Repeat("ab", 32) + `
`},
		want: []corpusDiag{{"jails/tools.yaml", 6, 10, "spec.image", `names no registry: write it out, as in oci://docker.io/library/team/web@sha256:…`}},
	},
	{
		name: "env key with the KEEL_ prefix",
		files: map[string]string{"apps/web.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: web
spec:
  port: 8080
  template:
    image: base/14.2-web
    env:
      KEEL_NODE: n1
`},
		want: []corpusDiag{{"apps/web.yaml", 10, 7, "spec.template.env.KEEL_NODE", `"KEEL_NODE": names starting with KEEL_ are set by the agent`}},
	},
	{
		name: "env key that is not a variable name",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
  env:
    LOG-LEVEL: debug
`},
		want: []corpusDiag{{"jails/tools.yaml", 8, 5, "spec.env.LOG-LEVEL", `"LOG-LEVEL" is not an environment variable name`}},
	},
	{
		name: "label key with a space",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
  labels:
    my team: ops
spec:
  image: base/14.2-base
`},
		want: []corpusDiag{{"jails/tools.yaml", 6, 5, "metadata.labels.my team", `label key "my team" is not valid`}},
	},
	{
		name: "label key with a bad prefix",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
  labels:
    Keel_Dev/team: ops
spec:
  image: base/14.2-base
`},
		want: []corpusDiag{{"jails/tools.yaml", 6, 5, "metadata.labels.Keel_Dev/team", `label key "Keel_Dev/team": the prefix before '/' must be a DNS name`}},
	},
	{
		name: "label value with a slash",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
  labels:
    team: ops/dev
spec:
  image: base/14.2-base
`},
		want: []corpusDiag{{"jails/tools.yaml", 6, 11, "metadata.labels.team", `label value "ops/dev" is not valid`}},
	},
	{
		name: "nodeSelector value ending with a dash",
		files: map[string]string{"apps/web.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: web
spec:
  port: 8080
  template:
    image: base/14.2-web
    nodeSelector:
      disk: ssd-
`},
		want: []corpusDiag{{"apps/web.yaml", 10, 13, "spec.template.nodeSelector.disk", `label value "ssd-" is not valid`}},
	},

	// keel.lock.
	{
		name: "two Services with the same VIP in keel.lock",
		files: map[string]string{
			"apps/web.yaml": corpusWeb,
			"apps/api.yaml": strings.Replace(corpusWeb, "name: web", "name: api", 1),
			"keel.lock": `apiVersion: keel/v1
kind: Lock
subnets: {}
vips:
  api: 10.201.0.10
  web: 10.201.0.10
pins: {}
`,
		},
		want: []corpusDiag{{"keel.lock", 6, 8, "vips.web", "10.201.0.10 is also the VIP of service api; remove one entry and run keel lock"}},
	},
	{
		name: "duplicate VIP entry in keel.lock",
		files: map[string]string{
			"apps/web.yaml": corpusWeb,
			"keel.lock": `apiVersion: keel/v1
kind: Lock
subnets: {}
vips:
  web: 10.201.0.10
  web: 10.201.0.11
pins: {}
`,
		},
		want: []corpusDiag{{"keel.lock", 6, 3, "vips.web", "duplicate key (first at line 5)"}},
	},
	{
		name: "locked subnet outside the podCIDR",
		files: map[string]string{
			"nodes/n3.yaml": corpusNode3,
			"keel.lock": `apiVersion: keel/v1
kind: Lock
subnets:
  n3: 10.199.3.0/24
vips: {}
pins: {}
`,
		},
		want: []corpusDiag{{"keel.lock", 4, 7, "subnets.n3", "10.199.3.0/24 is outside the cluster's podCIDR 10.200.0.0/16; remove the entry and run keel lock"}},
	},
	{
		name: "locked subnet taken by a node's explicit podCIDR",
		files: map[string]string{
			"nodes/n3.yaml": corpusNode3,
			"keel.lock": `apiVersion: keel/v1
kind: Lock
subnets:
  n3: 10.200.1.0/24
vips: {}
pins: {}
`,
		},
		want: []corpusDiag{{"keel.lock", 4, 7, "subnets.n3", "10.200.1.0/24 is also the subnet of node n1; remove one entry and run keel lock"}},
	},
	{
		name: "locked VIP outside the serviceCIDR",
		files: map[string]string{
			"apps/web.yaml": corpusWeb,
			"keel.lock": `apiVersion: keel/v1
kind: Lock
subnets: {}
vips:
  web: 10.202.0.5
pins: {}
`,
		},
		want: []corpusDiag{{"keel.lock", 5, 8, "vips.web", "10.202.0.5 is outside the cluster's serviceCIDR 10.201.0.0/16; remove the entry and run keel lock"}},
	},
	{
		name: "pin to a node not in the inventory tells the operator what to do",
		files: map[string]string{
			"apps/db.yaml": corpusDB,
			"keel.lock": `apiVersion: keel/v1
kind: Lock
subnets: {}
vips: {}
pins:
  db-0: n9
`,
		},
		want: []corpusDiag{{"keel.lock", 6, 9, "pins.db-0", "db-0 is pinned to node n9, which is not in the inventory: if n9 is gone for good (its volumes with it), delete this pin and run keel lock to place db-0 anew; otherwise restore nodes/n9.yaml"}},
	},
	{
		name: "pin contradicting the Service's spec.node",
		files: map[string]string{
			"apps/db.yaml": corpusDB + "    node: n2\n",
			"keel.lock": `apiVersion: keel/v1
kind: Lock
subnets: {}
vips: {}
pins:
  db-0: n1
  db-1: n2
`,
		},
		want: []corpusDiag{{"keel.lock", 6, 9, "pins.db-0", "db-0 is pinned to node n1 but its spec asks for node n2"}},
	},
	{
		name: "keel.lock of another kind",
		files: map[string]string{"keel.lock": `apiVersion: keel/v1
kind: Lok
subnets: {}
vips: {}
pins: {}
`},
		want: []corpusDiag{{"keel.lock", 2, 7, "kind", "keel.lock must start with apiVersion: keel/v1 and kind: Lock"}},
	},

	// Hostile and careless input: empty values, deep nesting, explicit
	// zeros, broken indentation, the wrong directory, too many instances.
	{
		name: "null in a command list is an error, not an empty argument",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
  command: [/bin/sh, null]
`},
		want: []corpusDiag{{"jails/tools.yaml", 7, 22, "spec.command[1]", `expected a string, got nothing (write "" for an empty string)`}},
	},
	{
		name: "empty env, label and nodeSelector values and list items are errors",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
  labels:
    tier:
spec:
  image: base/14.2-base
  command:
    - /bin/sh
    -
  env: {TZ: ~, LANG: ""}
  nodeSelector:
    disk: null
  volumes: [~]
`},
		want: []corpusDiag{
			{"jails/tools.yaml", 6, 10, "metadata.labels.tier", `expected a string, got nothing (write "" for an empty string)`},
			{"jails/tools.yaml", 11, 6, "spec.command[1]", `expected a string, got nothing (write "" for an empty string)`},
			{"jails/tools.yaml", 12, 13, "spec.env.TZ", `expected a string, got nothing (write "" for an empty string)`},
			{"jails/tools.yaml", 14, 11, "spec.nodeSelector.disk", `expected a string, got nothing (write "" for an empty string)`},
			{"jails/tools.yaml", 15, 13, "spec.volumes[0]", "expected a mapping (key: value), got nothing"},
		},
	},
	{
		name: "empty pin in keel.lock is an error",
		files: map[string]string{
			"apps/db.yaml": corpusDB,
			"keel.lock": `apiVersion: keel/v1
kind: Lock
subnets: {}
vips: {}
pins:
  db-0:
`,
		},
		want: []corpusDiag{{"keel.lock", 6, 8, "pins.db-0", `expected a string, got nothing (write "" for an empty string)`}},
	},
	{
		name: "5000-deep list where a string is expected is one depth error",
		files: map[string]string{"jails/tools.yaml": "apiVersion: keel/v1\nkind: Jail\nmetadata:\n  name: tools\nspec:\n  image: " +
			strings.Repeat("[", 5000) + strings.Repeat("]", 5000) + "\n"},
		// The root mapping is level 1, spec 2, the image's list 3 (column
		// 10), so level 33 is the list opened at column 40.
		want: []corpusDiag{{"jails/tools.yaml", 6, 40, "", "nested too deeply: more than 32 levels (the document is not read)"}},
	},
	{
		name: "5000-deep mapping under an unknown field is one depth error",
		files: map[string]string{"apps/web.yaml": "apiVersion: keel/v1\nkind: Service\nmetadata:\n  name: web\nspec: " +
			strings.Repeat("{a: ", 5000) + "1" + strings.Repeat("}", 5000) + "\n"},
		want: []corpusDiag{{"apps/web.yaml", 5, 128, "", "nested too deeply: more than 32 levels (the document is not read)"}},
	},
	{
		name:  "deep block nesting in cluster.yaml is one error, not also a missing Cluster",
		files: map[string]string{"cluster.yaml": corpusBase["cluster.yaml"] + corpusDeepBlock(40, 2)},
		want:  []corpusDiag{{"cluster.yaml", 38, 63, "", "nested too deeply: more than 32 levels (the document is not read)"}},
	},
	{
		name: "nesting past the YAML parser's own limit gets the same depth error",
		files: map[string]string{"jails/tools.yaml": "apiVersion: keel/v1\nkind: Jail\nmetadata:\n  name: tools\nspec:\n  command: " +
			strings.Repeat("[", 20000) + "\n"},
		want: []corpusDiag{{"jails/tools.yaml", 6, 10012, "", "nested too deeply: more than 32 levels (the document is not read)"}},
	},
	{
		name:  "keel.lock nested too deeply is one error",
		files: map[string]string{"keel.lock": "apiVersion: keel/v1\nkind: Lock\npins: " + strings.Repeat("[", 100) + strings.Repeat("]", 100) + "\n"},
		want:  []corpusDiag{{"keel.lock", 3, 38, "", "nested too deeply: more than 32 levels (the document is not read)"}},
	},
	{
		name:  "aliases repeating a mapping of 1000 keys are one error, not a million",
		files: map[string]string{"jails/tools.yaml": corpusAliasBomb(1000, 1000)},
		// The mapping is 2001 values: the fifth alias takes the repeated
		// values past 10000.
		want: []corpusDiag{{"jails/tools.yaml", 7, 37, "", "aliases repeat more than 10000 values (the document is not read)"}},
	},
	{
		name: "an alias inside the node it refers to is too deep",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
  command: &self [/bin/sh, *self]
`},
		want: []corpusDiag{{"jails/tools.yaml", 7, 28, "", "nested too deeply: more than 32 levels (the document is not read)"}},
	},
	{
		name: "an alias that nests its target past 32 levels is too deep",
		files: map[string]string{"jails/tools.yaml": "apiVersion: keel/v1\nkind: Jail\nmetadata:\n  name: tools\n  labels: &deep " +
			strings.Repeat("[", 20) + strings.Repeat("]", 20) + "\nspec:\n  image: base/14.2-base\n  command: " +
			strings.Repeat("[", 15) + "*deep" + strings.Repeat("]", 15) + "\n"},
		want: []corpusDiag{{"jails/tools.yaml", 8, 27, "", "nested too deeply: more than 32 levels (the document is not read)"}},
	},
	{
		name: "Ingress backend port 0 is an error, not the Service's port",
		files: map[string]string{
			"apps/web.yaml": corpusWeb,
			"ingress/www.yaml": `apiVersion: keel/v1
kind: Ingress
metadata:
  name: www
spec:
  host: www.example.com
  path: ""
  backend:
    service: web
    port: 0
  tls:
    email: ops@example.com
`,
		},
		want: []corpusDiag{
			{"ingress/www.yaml", 7, 9, "spec.path", `"" is not allowed: leave the field out to use the default (/)`},
			{"ingress/www.yaml", 10, 11, "spec.backend.port", "0 is not allowed: leave the field out to use the default (the Service's port)"},
		},
	},
	{
		name: "explicit empty command, restartPolicy, bridge and node are errors, not defaults",
		files: map[string]string{"apps/web.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: web
spec:
  port: 8080
  template:
    image: base/14.2-web
    command: []
    restartPolicy: ""
    network: {bridge: ""}
    node: ""
`},
		want: []corpusDiag{
			{"apps/web.yaml", 9, 14, "spec.template.command", "an empty list is not allowed: leave the field out to use the default (/bin/sh /etc/rc)"},
			{"apps/web.yaml", 10, 20, "spec.template.restartPolicy", `"" is not allowed: leave the field out to use the default (Always)`},
			{"apps/web.yaml", 11, 23, "spec.template.network.bridge", `"" is not allowed: leave the field out to use the default (the Cluster's bridge)`},
			{"apps/web.yaml", 12, 11, "spec.template.node", `"" is not allowed: leave the field out to use the default (any node the planner picks)`},
		},
	},
	{
		name:  "explicit empty reportKey is an error, not an unsigned node",
		files: map[string]string{"nodes/n2.yaml": corpusBase["nodes/n2.yaml"] + "  reportKey: \"\"\n"},
		want:  []corpusDiag{{"nodes/n2.yaml", 8, 14, "spec.reportKey", `"" is not allowed: leave the field out to use the default (none: the node's reports are not signed)`}},
	},
	{
		name: "broken indent on line 10 is reported on line 10",
		files: map[string]string{"apps/web.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: web
spec:
  port: 8080
  template:
    image: base/14.2-web
    restartPolicy: Always
   node: n1
`},
		want: []corpusDiag{{"apps/web.yaml", 10, 4, "", "invalid YAML: did not find expected key"}},
	},
	{
		name: "broken indent: a list item less indented than its siblings",
		files: map[string]string{"apps/web.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: web
spec:
  port: 8080
  template:
    image: base/14.2-web
    command:
      - /bin/sh
     - /etc/rc
`},
		want: []corpusDiag{{"apps/web.yaml", 11, 6, "", "invalid YAML: did not find expected key"}},
	},
	{
		name: "broken indent: a key indented deeper than its siblings",
		files: map[string]string{"apps/web.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: web
spec:
  port: 8080
  template:
    image: base/14.2-web
    env:
      TZ: UTC
       LANG: C
`},
		want: []corpusDiag{{"apps/web.yaml", 11, 12, "", "invalid YAML: mapping values are not allowed in this context"}},
	},
	{
		name: "broken indent: a top-level key indented by one space",
		files: map[string]string{"apps/web.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: web
 spec:
  port: 8080
`},
		want: []corpusDiag{{"apps/web.yaml", 5, 2, "", "invalid YAML: did not find expected key"}},
	},
	{
		name: "broken indent in a later document, columns counted in characters",
		files: map[string]string{"apps/web.yaml": corpusWeb + `---
apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
  env: {TZ: "Europe/Zürich"}
   node: n1
`},
		want: []corpusDiag{{"apps/web.yaml", 17, 4, "", "invalid YAML: did not find expected key"}},
	},
	{
		name: "missing colon after a key",
		files: map[string]string{"apps/web.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: web
spec:
  port: 8080
  template:
    image: base/14.2-web
    restartPolicy Always
    node: n1
`},
		want: []corpusDiag{{"apps/web.yaml", 9, 5, "", "invalid YAML: could not find expected ':'"}},
	},
	{
		name: "unclosed flow list is reported where it is open",
		files: map[string]string{"apps/web.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: web
spec:
  port: 8080
  template:
    image: base/14.2-web
    command: [/bin/sh, /etc/rc
    node: n1
`},
		want: []corpusDiag{{"apps/web.yaml", 9, 24, "", "invalid YAML: did not find expected ',' or ']'"}},
	},
	{
		name: "broken indent in keel.lock has its position",
		files: map[string]string{"keel.lock": `apiVersion: keel/v1
kind: Lock
subnets:
  n1: 10.200.1.0/24
 n2: 10.200.2.0/24
`},
		want: []corpusDiag{{"keel.lock", 5, 2, "", "invalid YAML: did not find expected key"}},
	},
	{
		name:  "YAML error in cluster.yaml is one error, not also a missing Cluster",
		files: map[string]string{"cluster.yaml": corpusBase["cluster.yaml"] + "   pool: tank\n"},
		want:  []corpusDiag{{"cluster.yaml", 8, 8, "", "invalid YAML: mapping values are not allowed in this context"}},
	},
	{
		name: "outside a cluster repository nothing else is read",
		drop: []string{"cluster.yaml"},
		files: map[string]string{
			"docker-compose.yaml":       "services:\n  web:\n    image: nginx\n",
			".github/workflows/ci.yaml": corpusForeign,
			"deploy/k8s.yaml":           "apiVersion: apps/v1\nkind: Deployment\n",
			"broken.yaml":               "a: [\n",
		},
		want: []corpusDiag{{"cluster.yaml", 0, 0, "", "missing: there is no cluster.yaml here, so this is not a cluster repository and nothing else was read (is --repo the right directory?)"}},
	},
	{
		name:  "maxInstances 0, negative or above the limit",
		files: map[string]string{"cluster.yaml": corpusBase["cluster.yaml"] + "  maxInstances: 0\n"},
		want:  []corpusDiag{{"cluster.yaml", 8, 17, "spec.maxInstances", "0 is not allowed: leave the field out to use the default (10000)"}},
	},
	{
		name:  "maxInstances above the limit",
		files: map[string]string{"cluster.yaml": corpusBase["cluster.yaml"] + "  maxInstances: 100001\n"},
		want:  []corpusDiag{{"cluster.yaml", 8, 17, "spec.maxInstances", "100001 is not an instance cap (1-100000)"}},
	},
	{
		name:  "negative maxInstances",
		files: map[string]string{"cluster.yaml": corpusBase["cluster.yaml"] + "  maxInstances: -5\n"},
		want:  []corpusDiag{{"cluster.yaml", 8, 17, "spec.maxInstances", "-5 is not an instance cap (1-100000)"}},
	},
	{
		name:  "replicas above 10000",
		files: map[string]string{"apps/web.yaml": strings.Replace(corpusWeb, "  port: 8080\n", "  replicas: 10001\n  port: 8080\n", 1)},
		want:  []corpusDiag{{"apps/web.yaml", 6, 13, "spec.replicas", "10001 is more than 10000 replicas"}},
	},
	{
		name:  "30 Services of 10000 replicas are over the default instance cap",
		files: map[string]string{"apps/many.yaml": corpusServices(30, 10000)},
		want:  []corpusDiag{{"apps/many.yaml", 16, 13, "spec.replicas", "10000 replicas bring the cluster to 300000 instances (Jails and Service replicas), more than its maxInstances of 10000: lower replicas, or raise spec.maxInstances in cluster.yaml (at most 100000)"}},
	},
	{
		name:  "100 Services of 10000 replicas are over the default instance cap",
		files: map[string]string{"apps/many.yaml": corpusServices(100, 10000)},
		want:  []corpusDiag{{"apps/many.yaml", 16, 13, "spec.replicas", "10000 replicas bring the cluster to 1000000 instances (Jails and Service replicas), more than its maxInstances of 10000: lower replicas, or raise spec.maxInstances in cluster.yaml (at most 100000)"}},
	},
	{
		name: "the Service whose replicas cross a lowered cap is blamed, Jails counted first",
		files: map[string]string{
			"cluster.yaml":     corpusBase["cluster.yaml"] + "  maxInstances: 4\n",
			"jails/tools.yaml": "apiVersion: keel/v1\nkind: Jail\nmetadata:\n  name: tools\nspec:\n  image: base/14.2-base\n",
			"apps/many.yaml":   corpusServices(3, 2),
		},
		want: []corpusDiag{{"apps/many.yaml", 16, 13, "spec.replicas", "2 replicas bring the cluster to 7 instances (Jails and Service replicas), more than its maxInstances of 4: lower replicas, or raise spec.maxInstances in cluster.yaml (at most 100000)"}},
	},
	{
		name: "Jails alone over the cap: the first Jail past it is blamed",
		files: map[string]string{
			"cluster.yaml": corpusBase["cluster.yaml"] + "  maxInstances: 1\n",
			"jails/a.yaml": "apiVersion: keel/v1\nkind: Jail\nmetadata:\n  name: a\nspec:\n  image: base/14.2-base\n",
			"jails/b.yaml": "apiVersion: keel/v1\nkind: Jail\nmetadata:\n  name: b\nspec:\n  image: base/14.2-base\n",
		},
		want: []corpusDiag{{"jails/b.yaml", 1, 1, "", "this Jail brings the cluster to 2 instances (Jails and Service replicas), more than its maxInstances of 1: remove some, or raise spec.maxInstances in cluster.yaml (at most 100000)"}},
	},

	// Everything at once.
	{
		name: "errors in several files are all reported, sorted by file then line",
		files: map[string]string{
			"cluster.yaml": corpusBase["cluster.yaml"] + "  reportInterval: 20s\n",
			"nodes/n2.yaml": `apiVersion: keel/v1
kind: Node
metadata:
  name: n2
spec:
  address: 192.0.2.11
  podCIDR: 10.200.2.0/24
`,
			"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: debian
`,
			"apps/web.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: web
spec:
  port: 0
  template:
    image: base/14.2-web
    imagePullPolicy: Always
`,
			"ingress/www.yaml": `apiVersion: keel/v1
kind: Ingress
metadata:
  name: www
spec:
  host: www
  backend:
    service: web
  tls:
    email: ops@example.com
`,
		},
		want: []corpusDiag{
			{"apps/web.yaml", 6, 9, "spec.port", "0 is not a TCP port (1-65535)"},
			{"apps/web.yaml", 9, 5, "spec.template.imagePullPolicy", `unknown field "imagePullPolicy"`},
			{"cluster.yaml", 8, 19, "spec.reportInterval", "20s is more than a third of livenessTTL 30s"},
			{"ingress/www.yaml", 6, 9, "spec.host", `"www" is not a fully qualified host name`},
			{"jails/tools.yaml", 6, 10, "spec.image", `"debian" is not a valid image`},
			{"nodes/n2.yaml", 6, 12, "spec.address", "192.0.2.11 is also the address of node n1"},
		},
	},
}

func TestCorpusInvalid(t *testing.T) {
	t.Parallel()
	runCorpusInvalid(t, corpusInvalid)
}

// runCorpusInvalid renders each case and checks that it reports exactly
// the errors the case expects, in order, and that the error text is them.
func runCorpusInvalid(t *testing.T, cases []corpusInvalidCase) {
	seen := map[string]bool{}
	for _, tc := range cases {
		if seen[tc.name] {
			t.Fatalf("two cases are named %q", tc.name)
		}
		seen[tc.name] = true
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if len(tc.want) == 0 {
				t.Fatal("an invalid case must expect at least one error")
			}
			m, err := render.Render(corpusFS(tc.files, tc.drop))
			inv, ok := err.(*render.InvalidError)
			if !ok {
				t.Fatalf("Render() error = %v (%T), want *render.InvalidError", err, err)
			}
			if m == nil {
				t.Error("Render() returned no partial model with its InvalidError")
			}
			got := inv.Diagnostics
			ok = len(got) == len(tc.want)
			for i := 0; ok && i < len(got); i++ {
				ok = tc.want[i].matches(got[i])
			}
			if !ok {
				var b strings.Builder
				for _, d := range got {
					fmt.Fprintf(&b, "\n\t%s [%s]", d, d.Severity)
				}
				b.WriteString("\nwant:")
				for _, w := range tc.want {
					fmt.Fprintf(&b, "\n\t%s", w)
				}
				t.Errorf("Render() errors:%s", b.String())
			}
			// The error text is the diagnostics, one a line, in the
			// compiler format file:line:col: field: message.
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(got) {
				t.Fatalf("Error() has %d lines, want %d:\n%s", len(lines), len(got), err)
			}
			for i, d := range got {
				prefix := d.Pos.String() + ": "
				if d.Field != "" {
					prefix += d.Field + ": "
				}
				if lines[i] != prefix+d.Message {
					t.Errorf("Error() line %d = %q, want %q", i+1, lines[i], prefix+d.Message)
				}
			}
		})
	}
}

// TestCorpusErrorText pins the exact text of a report that spans files, as
// keel validate prints it.
func TestCorpusErrorText(t *testing.T) {
	t.Parallel()
	fsys := corpusFS(map[string]string{
		"cluster.yaml": corpusBase["cluster.yaml"] + "  bridge: br0\n",
		"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: Tools
spec:
  image: base/14.2-base
  resources:
    cpu: "0"
`,
	}, nil)
	_, err := render.Render(fsys)
	want := `cluster.yaml:8:11: spec.bridge: "br0" is not a Keel bridge name (want keel<N>, e.g. keel0)
jails/tools.yaml:4:9: metadata.name: "Tools" is not a valid name (lowercase letters, digits and '-', starting and ending with a letter or digit)
jails/tools.yaml:8:10: spec.resources.cpu: "0" is less than the smallest CPU amount, 10m (1% of a core)`
	if err == nil || err.Error() != want {
		t.Errorf("Render() error =\n%v\nwant\n%s", err, want)
	}
}

type corpusValidCase struct {
	name  string
	files map[string]string
	drop  []string
	check func(t *testing.T, m *render.Model)
}

func corpusInstance(t *testing.T, m *render.Model, name string) *render.Instance {
	t.Helper()
	inst := m.Instance(name)
	if inst == nil {
		t.Fatalf("no instance %q; instances: %v", name, corpusInstanceNames(m))
	}
	return inst
}

func corpusService(t *testing.T, m *render.Model, name string) *render.Service {
	t.Helper()
	svc := m.Service(name)
	if svc == nil {
		t.Fatalf("no Service %q", name)
	}
	return svc
}

func corpusInstanceNames(m *render.Model) []string {
	var names []string
	for _, inst := range m.Instances {
		names = append(names, inst.Name)
	}
	return names
}

func corpusEqual[T any](t *testing.T, what string, got, want T) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s = %+v, want %+v", what, got, want)
	}
}

func corpusPrefix(s string) render.Prefix { return render.Prefix{Prefix: netip.MustParsePrefix(s)} }
func corpusAddr(s string) render.Addr     { return render.Addr{Addr: netip.MustParseAddr(s)} }

// corpusToolsAt is a Jail tools with the explicit address addr.
func corpusToolsAt(addr string) string {
	return "apiVersion: keel/v1\nkind: Jail\nmetadata:\n  name: tools\nspec:\n  image: base/14.2-base\n  network:\n    address: " + addr + "\n"
}

// corpusForeign is YAML that is not a Keel spec: read, it is an error.
const corpusForeign = "name: checks\non: [pull_request]\njobs: {}\n"

// corpusIgnored is a repository with YAML that Keel must not read: listed
// in .keelignore, under dot-directories, in dotfiles, or not *.yaml/*.yml.
var corpusIgnored = map[string]string{
	".keelignore":                "# not Keel specs\nci/\ndocker-compose.yaml\n*.k8s.yaml\n",
	"ci/checks.yml":              corpusForeign,
	"docker-compose.yaml":        "services:\n  web:\n    image: nginx\n",
	"deploy/web.k8s.yaml":        "apiVersion: apps/v1\nkind: Deployment\n",
	".github/workflows/ci.yaml":  corpusForeign,
	"jails/.hidden/draft.yaml":   corpusForeign,
	".yamllint.yaml":             "extends: default\n",
	"jails/.tools.yaml.swp.yaml": corpusForeign,
	"README.md":                  "# cluster\n",
	"jails/notes.txt":            "apiVersion: keel/v1\n",
	"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
`,
}

var corpusValid = []corpusValidCase{
	{
		name: "two Jails pinned to one node share a volume",
		files: map[string]string{
			"jails/a.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: a
spec:
  image: base/14.2-base
  node: n1
  volumes:
    - {name: data, mountPath: /var/db, size: 10G}
`,
			// b is pinned to n1 by its address, and c by spec.node too.
			"jails/b.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: b
spec:
  image: base/14.2-base
  network:
    address: 10.200.1.20/24
  volumes:
    - {name: data, mountPath: /srv/data, size: 10240M}
    - {name: own, mountPath: /var/log}
---
apiVersion: keel/v1
kind: Jail
metadata:
  name: c
spec:
  image: base/14.2-base
  node: n1
  volumes:
    - {name: data, mountPath: /data, size: 10G}
`,
		},
		check: func(t *testing.T, m *render.Model) {
			for _, name := range []string{"a", "b", "c"} {
				inst := corpusInstance(t, m, name)
				corpusEqual(t, name+".Node", inst.Node, "n1")
				corpusEqual(t, name+".Stateful", inst.Stateful, true)
				corpusEqual(t, name+".Spec.Volumes[0].Name", inst.Spec.Volumes[0].Name, "data")
				corpusEqual(t, name+".Spec.Volumes[0].Size", inst.Spec.Volumes[0].Size, render.Bytes(10<<30))
			}
			corpusEqual(t, "b.Spec.Volumes[0].MountPath", corpusInstance(t, m, "b").Spec.Volumes[0].MountPath, "/srv/data")
		},
	},
	{
		name:  "Jail address in CIDR form renders as the bare address",
		files: map[string]string{"jails/tools.yaml": corpusToolsAt("10.200.2.10/24")},
		check: func(t *testing.T, m *render.Model) {
			inst := corpusInstance(t, m, "tools")
			corpusEqual(t, "Spec.Network.Address", inst.Spec.Network.Address, corpusAddr("10.200.2.10"))
			corpusEqual(t, "Node", inst.Node, "n2")
			corpusEqual(t, "NodeSubnet", inst.NodeSubnet, corpusPrefix("10.200.2.0/24"))
			// The same Jail with the bare address is the same instance.
			bare, err := render.Render(corpusFS(map[string]string{"jails/tools.yaml": corpusToolsAt("10.200.2.10")}, nil))
			if err != nil {
				t.Fatal(err)
			}
			corpusEqual(t, "instance", *inst, *corpusInstance(t, bare, "tools"))
		},
	},
	{
		name: "Jail address in CIDR form in a derived subnet",
		files: map[string]string{
			"nodes/n3.yaml":    corpusNode3,
			"jails/tools.yaml": corpusToolsAt("10.200.38.20/24"),
		},
		check: func(t *testing.T, m *render.Model) {
			if n3 := m.Node("n3"); n3 == nil || n3.PodCIDR != corpusPrefix("10.200.38.0/24") {
				t.Fatalf("n3 = %+v: the case assumes n3 derives 10.200.38.0/24", n3)
			}
			inst := corpusInstance(t, m, "tools")
			corpusEqual(t, "Spec.Network.Address", inst.Spec.Network.Address, corpusAddr("10.200.38.20"))
			corpusEqual(t, "Node", inst.Node, "n3")
		},
	},
	{
		name: "replicas 0 is a Service with no instances",
		files: map[string]string{"apps/web.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: web
spec:
  replicas: 0
  port: 8080
  template:
    image: base/14.2-web
`},
		check: func(t *testing.T, m *render.Model) {
			svc := corpusService(t, m, "web")
			corpusEqual(t, "Replicas", svc.Replicas, 0)
			corpusEqual(t, "Instances", len(svc.Instances), 0)
			if !svc.VIP.IsValid() {
				t.Error("a Service with no replicas still has a VIP")
			}
			corpusEqual(t, "instances", corpusInstanceNames(m), []string(nil))
		},
	},
	{
		name: "a Service without volumes is stateless",
		files: map[string]string{"apps/web.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: web
spec:
  replicas: 2
  port: 8080
  template:
    image: base/14.2-web
`},
		check: func(t *testing.T, m *render.Model) {
			svc := corpusService(t, m, "web")
			corpusEqual(t, "Service.Stateful", svc.Stateful, false)
			corpusEqual(t, "Service.Instances", svc.Instances, []string{"web-0", "web-1"})
			for i, name := range svc.Instances {
				inst := corpusInstance(t, m, name)
				corpusEqual(t, name+".Stateful", inst.Stateful, false)
				corpusEqual(t, name+".Spec.Volumes", inst.Spec.Volumes, []render.Volume(nil))
				corpusEqual(t, name+".Service", inst.Service, "web")
				corpusEqual(t, name+".Index", inst.Index, i)
			}
		},
	},
	{
		name: "multi-document file with empty documents and a trailing ---",
		files: map[string]string{"jails/all.yaml": `---
apiVersion: keel/v1
kind: Jail
metadata:
  name: a
spec:
  image: base/14.2-base
---
---
# only a comment
---
apiVersion: keel/v1
kind: Jail
metadata:
  name: b
spec:
  image: base/14.2-base
---
`},
		check: func(t *testing.T, m *render.Model) {
			corpusEqual(t, "instances", corpusInstanceNames(m), []string{"a", "b"})
			corpusEqual(t, "a.Source", corpusInstance(t, m, "a").Source, render.Position{File: "jails/all.yaml", Line: 2, Column: 1})
			corpusEqual(t, "b.Source", corpusInstance(t, m, "b").Source, render.Position{File: "jails/all.yaml", Line: 12, Column: 1})
		},
	},
	{
		name: "specs in nested directories",
		files: map[string]string{"a/b/c/x.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: x
spec:
  image: base/14.2-base
`},
		check: func(t *testing.T, m *render.Model) {
			corpusEqual(t, "x.Source", corpusInstance(t, m, "x").Source, render.Position{File: "a/b/c/x.yaml", Line: 1, Column: 1})
		},
	},
	{
		name:  "foreign YAML skipped by .keelignore, dot-directories and dotfiles",
		files: corpusIgnored,
		check: func(t *testing.T, m *render.Model) {
			corpusEqual(t, "instances", corpusInstanceNames(m), []string{"tools"})
		},
	},
	{
		name: ".yml files are specs too",
		files: map[string]string{
			"apps/web.yml": corpusWeb,
			"nodes/n3.yml": corpusNode3,
		},
		check: func(t *testing.T, m *render.Model) {
			corpusEqual(t, "web.Source", corpusService(t, m, "web").Source, render.Position{File: "apps/web.yml", Line: 1, Column: 1})
			if n := m.Node("n3"); n == nil || n.Source.File != "nodes/n3.yml" {
				t.Errorf("node n3 = %+v, want it read from nodes/n3.yml", n)
			}
		},
	},
	{
		name: "Jail defaults: command, resources, restartPolicy, terminationGracePeriod, no checks and the cluster's bridge",
		files: map[string]string{
			"cluster.yaml": corpusBase["cluster.yaml"] + "  bridge: keel3\n",
			"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: tools
spec:
  image: base/14.2-base
`,
			"jails/own-bridge.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: own-bridge
spec:
  image: base/14.2-base
  network:
    bridge: keel5
`,
		},
		check: func(t *testing.T, m *render.Model) {
			tools := corpusInstance(t, m, "tools")
			corpusEqual(t, "tools.Spec", tools.Spec, render.JailSpec{
				Image:         "base/14.2-base",
				Command:       []string{"/bin/sh", "/etc/rc"},
				Network:       render.Network{Bridge: "keel3"},
				Resources:     render.Resources{CPU: 1000, Memory: 512 << 20},
				RestartPolicy: "Always",
				// A Jail without checks gets none: it is ready when running.
				TerminationGracePeriod: render.Duration(10 * time.Second),
			})
			corpusEqual(t, "tools.Node", tools.Node, "")
			corpusEqual(t, "tools.Stateful", tools.Stateful, false)
			corpusEqual(t, "tools.Resources", fmt.Sprint(tools.Spec.Resources.CPU, " ", tools.Spec.Resources.Memory), "1 512M")
			corpusEqual(t, "own-bridge bridge", corpusInstance(t, m, "own-bridge").Spec.Network.Bridge, "keel5")
			if len(tools.SpecHash) != 48 {
				t.Errorf("tools.SpecHash = %q, want 48 hex digits", tools.SpecHash)
			}
		},
	},
	{
		name: "Ingress defaults: path / and the Service's port",
		files: map[string]string{
			"apps/web.yaml": corpusWeb,
			"ingress/www.yaml": `apiVersion: keel/v1
kind: Ingress
metadata:
  name: www
spec:
  host: www.example.com
  backend:
    service: web
  tls:
    email: ops@example.com
`,
			"ingress/api.yaml": `apiVersion: keel/v1
kind: Ingress
metadata:
  name: api
spec:
  host: www.example.com
  path: /api
  backend:
    service: web
    port: 9090
`,
		},
		check: func(t *testing.T, m *render.Model) {
			corpusEqual(t, "ingresses", m.Ingresses, []render.Ingress{
				{
					Name: "api", Host: "www.example.com", Path: "/api",
					Backend: render.Backend{Service: "web", Port: 9090},
					Source:  render.Position{File: "ingress/api.yaml", Line: 1, Column: 1},
				},
				{
					Name: "www", Host: "www.example.com", Path: "/",
					Backend: render.Backend{Service: "web", Port: 8080},
					TLS:     &render.TLS{Email: "ops@example.com"},
					Source:  render.Position{File: "ingress/www.yaml", Line: 1, Column: 1},
				},
			})
		},
	},
	{
		name: "Cluster, Node and Service defaults",
		files: map[string]string{
			"cluster.yaml":  "apiVersion: keel/v1\nkind: Cluster\nmetadata:\n  name: test\n",
			"nodes/n3.yaml": corpusNode3,
			"apps/web.yaml": corpusWeb,
		},
		check: func(t *testing.T, m *render.Model) {
			corpusEqual(t, "Cluster", m.Cluster, render.Cluster{
				Name:            "test",
				PodCIDR:         corpusPrefix("10.200.0.0/16"),
				ServiceCIDR:     corpusPrefix("10.201.0.0/16"),
				Bridge:          "keel0",
				Pool:            "zroot",
				LivenessTTL:     render.Duration(30e9),
				ReportInterval:  render.Duration(10e9),
				ReportRefPrefix: "refs/keel/reports/",
				MaxInstances:    10000,
			})
			n3 := m.Node("n3")
			if n3 == nil {
				t.Fatal("no node n3")
			}
			corpusEqual(t, "n3.Schedulable", n3.Schedulable, true)
			corpusEqual(t, "n3.PodCIDRSource", n3.PodCIDRSource, render.SourceDerived)
			if p := n3.PodCIDR; p.Bits() != 24 || !m.Cluster.PodCIDR.Contains(p.Addr()) {
				t.Errorf("n3.PodCIDR = %s, want a /24 of %s", p, m.Cluster.PodCIDR)
			}
			web := corpusService(t, m, "web")
			corpusEqual(t, "web.Replicas", web.Replicas, 1)
			corpusEqual(t, "web.Instances", web.Instances, []string{"web-0"})
			corpusEqual(t, "web.VIPSource", web.VIPSource, render.SourceDerived)
			if !m.Cluster.ServiceCIDR.Contains(web.VIP.Addr) {
				t.Errorf("web.VIP = %s, want an address of %s", web.VIP, m.Cluster.ServiceCIDR)
			}
		},
	},
	{
		name: "template volumes expand to <replica>-<volume>",
		files: map[string]string{"apps/db.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: db
spec:
  replicas: 2
  port: 5432
  template:
    image: base/14.2-postgres
    volumes:
      - name: data
        mountPath: /var/db/postgres/
        size: 20G
      - name: wal
        mountPath: /var/db/wal
`},
		check: func(t *testing.T, m *render.Model) {
			corpusEqual(t, "db.Stateful", corpusService(t, m, "db").Stateful, true)
			for _, r := range []string{"db-0", "db-1"} {
				inst := corpusInstance(t, m, r)
				corpusEqual(t, r+".Stateful", inst.Stateful, true)
				corpusEqual(t, r+".Spec.Volumes", inst.Spec.Volumes, []render.Volume{
					{Name: r + "-data", MountPath: "/var/db/postgres", Size: 20 << 30},
					{Name: r + "-wal", MountPath: "/var/db/wal"},
				})
			}
		},
	},
	{
		name: "a Jail's explicit address fixes its node",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: bastion
spec:
  image: base/14.2-base
  network:
    address: 10.200.2.10
---
apiVersion: keel/v1
kind: Jail
metadata:
  name: exporter
spec:
  image: base/14.2-base
  node: n1
  network:
    address: 10.200.1.254
`},
		check: func(t *testing.T, m *render.Model) {
			bastion := corpusInstance(t, m, "bastion")
			corpusEqual(t, "bastion.Node", bastion.Node, "n2")
			corpusEqual(t, "bastion address", bastion.Spec.Network.Address, corpusAddr("10.200.2.10"))
			exporter := corpusInstance(t, m, "exporter")
			corpusEqual(t, "exporter.Node", exporter.Node, "n1")
			corpusEqual(t, "exporter address", exporter.Spec.Network.Address, corpusAddr("10.200.1.254"))
		},
	},
	{
		name: "cpu as a YAML number or millicores, sizes with binary suffixes",
		files: map[string]string{"jails/tools.yaml": `apiVersion: keel/v1
kind: Jail
metadata:
  name: two
spec:
  image: base/14.2-base
  resources:
    cpu: 2
    memory: 1Gi
  volumes:
    - name: two-data
      mountPath: /data
      size: 1Gi
---
apiVersion: keel/v1
kind: Jail
metadata:
  name: half
spec:
  image: base/14.2-base
  resources:
    cpu: 0.5
    memory: 512M
---
apiVersion: keel/v1
kind: Jail
metadata:
  name: milli
spec:
  image: base/14.2-base
  resources:
    cpu: "500m"
    memory: 64Mi
`},
		check: func(t *testing.T, m *render.Model) {
			corpusEqual(t, "two", corpusInstance(t, m, "two").Spec.Resources, render.Resources{CPU: 2000, Memory: 1 << 30})
			corpusEqual(t, "two volume size", corpusInstance(t, m, "two").Spec.Volumes[0].Size, render.Bytes(1<<30))
			corpusEqual(t, "half", corpusInstance(t, m, "half").Spec.Resources, render.Resources{CPU: 500, Memory: 512 << 20})
			corpusEqual(t, "milli", corpusInstance(t, m, "milli").Spec.Resources, render.Resources{CPU: 500, Memory: 64 << 20})
		},
	},
	{
		// Issue 10: shared certificates are encrypted with age to the
		// ingress nodes' report keys; a node whose key age cannot encrypt
		// to (or that has none) is warned about, and a node that is not an
		// ingress node is not.
		name: "an ingress node that cannot receive shared certificates is warned about",
		files: map[string]string{
			"nodes/n1.yaml": strings.Replace(corpusBase["nodes/n1.yaml"], "    disk: ssd\n", "    disk: ssd\n    keel.dev/ingress: \"true\"\n", 1) +
				"  reportKey: ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPDghd51i3iE461GSNFWLl+N8/yUOIWlhfxOZYlsKQIL n1\n",
			"nodes/n2.yaml": strings.Replace(corpusBase["nodes/n2.yaml"], "  name: n2\n", "  name: n2\n  labels:\n    keel.dev/ingress: \"true\"\n", 1) +
				"  reportKey: ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBJum8ML2vEBWtEgOMzHfYRbPCq/Uguc3GQJhEdjOGtLOXWVlapoJtzCOafPuzePVPJBQ1j755eS781EU7rzhMe0= n2\n",
			"nodes/n3.yaml": corpusNode3,
			"apps/web.yaml": corpusWeb,
			"ingress/www.yaml": `apiVersion: keel/v1
kind: Ingress
metadata:
  name: www
spec:
  host: www.example.com
  backend:
    service: web
  tls:
    email: ops@example.com
`,
		},
		check: func(t *testing.T, m *render.Model) {
			var got []string
			for _, d := range m.Diagnostics {
				if strings.Contains(d.Message, "shared certificates") {
					got = append(got, fmt.Sprintf("%s:%d %s", d.Pos.File, d.Pos.Line, d.Field))
				}
			}
			corpusEqual(t, "warnings", got, []string{"nodes/n2.yaml:1 spec.reportKey"})
			corpusEqual(t, "ingress nodes", len(m.IngressNodes()), 2)
		},
	},
	{
		name: "keel.lock entries are honoured and leave nothing to warn about",
		files: map[string]string{
			"nodes/n3.yaml": corpusNode3,
			"apps/web.yaml": corpusWeb,
			"apps/db.yaml":  corpusDB,
			"keel.lock": `apiVersion: keel/v1
kind: Lock
subnets:
  n1: 10.200.1.0/24
  n2: 10.200.2.0/24
  n3: 10.200.3.0/24
vips:
  db: 10.201.0.11
  web: 10.201.0.10
pins:
  db-0: n1
  db-1: n3
`,
		},
		check: func(t *testing.T, m *render.Model) {
			// The nodes have no reportKey (warned about); nothing else.
			for _, d := range m.Diagnostics {
				if d.Field != "spec.reportKey" {
					t.Errorf("diagnostic %v, want none about the lock", d)
				}
			}
			n3 := m.Node("n3")
			if n3 == nil {
				t.Fatal("no node n3")
			}
			corpusEqual(t, "n3.PodCIDR", n3.PodCIDR, corpusPrefix("10.200.3.0/24"))
			corpusEqual(t, "n3.PodCIDRSource", n3.PodCIDRSource, render.SourceLocked)
			web := corpusService(t, m, "web")
			corpusEqual(t, "web.VIP", web.VIP, corpusAddr("10.201.0.10"))
			corpusEqual(t, "web.VIPSource", web.VIPSource, render.SourceLocked)
			corpusEqual(t, "pins", m.Lock.Pins, map[string]string{"db-0": "n1", "db-1": "n3"})
		},
	},
	{
		name: "replica names of exactly 63 characters",
		files: map[string]string{"apps/long.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: ` + corpusLong("w", 61) + `
spec:
  replicas: 10
  port: 8080
  template:
    image: base/14.2-web
`},
		check: func(t *testing.T, m *render.Model) {
			svc := corpusService(t, m, corpusLong("w", 61))
			last := svc.Instances[len(svc.Instances)-1]
			corpusEqual(t, "last replica", last, corpusLong("w", 61)+"-9")
			corpusEqual(t, "its length", len(last), 63)
		},
	},
	{
		name:  "reportInterval of exactly a third of livenessTTL",
		files: map[string]string{"cluster.yaml": corpusBase["cluster.yaml"] + "  livenessTTL: 9s\n  reportInterval: 3s\n"},
		check: func(t *testing.T, m *render.Model) {
			corpusEqual(t, "livenessTTL", m.Cluster.LivenessTTL.String(), "9s")
			corpusEqual(t, "reportInterval", m.Cluster.ReportInterval.String(), "3s")
		},
	},
	{
		name: "a Service's template placement is given to every replica",
		files: map[string]string{"apps/web.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: web
spec:
  replicas: 2
  port: 8080
  template:
    image: base/14.2-web
    env:
      LOG_LEVEL: info
    nodeSelector:
      disk: ssd
`},
		check: func(t *testing.T, m *render.Model) {
			for _, name := range []string{"web-0", "web-1"} {
				inst := corpusInstance(t, m, name)
				corpusEqual(t, name+".NodeSelector", inst.NodeSelector, map[string]string{"disk": "ssd"})
				corpusEqual(t, name+".Env", inst.Spec.Env, map[string]string{"LOG_LEVEL": "info"})
			}
			if a, b := corpusInstance(t, m, "web-0").SpecHash, corpusInstance(t, m, "web-1").SpecHash; a != b {
				t.Errorf("replicas of one template have specHashes %s and %s, want the same", a, b)
			}
		},
	},
	{
		name: "aliases reuse a mapping, and a repository at its instance cap is valid",
		files: map[string]string{
			"cluster.yaml":     corpusBase["cluster.yaml"] + "  maxInstances: 3\n",
			"jails/tools.yaml": "apiVersion: keel/v1\nkind: Jail\nmetadata:\n  name: tools\nspec:\n  image: base/14.2-base\n",
			"apps/web.yaml": `apiVersion: keel/v1
kind: Service
metadata:
  name: web
  labels: &sel {disk: ssd}
spec:
  replicas: 2
  port: 8080
  template:
    image: base/14.2-web
    nodeSelector: *sel
`,
		},
		check: func(t *testing.T, m *render.Model) {
			corpusEqual(t, "instances", corpusInstanceNames(m), []string{"tools", "web-0", "web-1"})
			corpusEqual(t, "web-1.NodeSelector", corpusInstance(t, m, "web-1").NodeSelector, map[string]string{"disk": "ssd"})
			corpusEqual(t, "Cluster.MaxInstances", m.Cluster.MaxInstances, 3)
		},
	},
}

func TestCorpusValid(t *testing.T) {
	t.Parallel()
	runCorpusValid(t, corpusValid)
}

// runCorpusValid renders each case, which must have no error, and runs
// its check on the model.
func runCorpusValid(t *testing.T, cases []corpusValidCase) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m, err := render.Render(corpusFS(tc.files, tc.drop))
			if err != nil {
				t.Fatalf("Render() error:\n%v", err)
			}
			if errs := m.Diagnostics.Errors(); len(errs) > 0 {
				t.Fatalf("model carries errors: %v", errs)
			}
			tc.check(t, m)
		})
	}
}

// TestCorpusSpecFiles checks which files of corpusIgnored are read.
func TestCorpusSpecFiles(t *testing.T) {
	t.Parallel()
	got, err := render.SpecFiles(corpusFS(corpusIgnored, nil))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"cluster.yaml", "jails/tools.yaml", "nodes/n1.yaml", "nodes/n2.yaml"}
	if !slices.Equal(got, want) {
		t.Errorf("SpecFiles() = %q, want %q", got, want)
	}
}
