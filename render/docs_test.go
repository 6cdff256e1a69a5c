package render_test

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/keel-dev/keel/render"
)

// docsYAMLBlock is a ```yaml block of a Markdown page.
var docsYAMLBlock = regexp.MustCompile("(?s)\n```yaml\n(.*?)\n```")

// TestSpecDocExamplesRender renders every Jail and Service example of
// docs/spec.md, each on its own next to the nodes the examples name: an
// example a reader copies must be valid.
func TestSpecDocExamplesRender(t *testing.T) {
	t.Parallel()
	page, err := os.ReadFile("../docs/spec.md")
	if err != nil {
		t.Fatal(err)
	}
	base := map[string]string{
		"cluster.yaml":    "apiVersion: keel/v1\nkind: Cluster\nmetadata: {name: docs}\n",
		"nodes/fra1.yaml": "apiVersion: keel/v1\nkind: Node\nmetadata: {name: fra1, labels: {disk: ssd}}\nspec: {address: 192.0.2.11, podCIDR: 10.200.11.0/24}\n",
		"nodes/fra3.yaml": "apiVersion: keel/v1\nkind: Node\nmetadata: {name: fra3, labels: {zone: fra-c}}\nspec: {address: 192.0.2.13, podCIDR: 10.200.13.0/24}\n",
	}
	n := 0
	for _, m := range docsYAMLBlock.FindAllStringSubmatch(string(page), -1) {
		example := m[1]
		if !strings.Contains(example, "\nkind: Jail\n") && !strings.Contains(example, "\nkind: Service\n") {
			continue
		}
		n++
		fsys := fstest.MapFS{"example.yaml": {Data: []byte(example + "\n")}}
		for name, data := range base {
			fsys[name] = &fstest.MapFile{Data: []byte(data)}
		}
		if _, err := render.Render(fsys); err != nil {
			t.Errorf("this example of docs/spec.md does not render:\n%s\nerrors:\n%v", example, err)
		}
	}
	if n < 4 {
		t.Errorf("found %d Jail and Service examples in docs/spec.md, want at least 4 (Jail, Service, Health checks, Rollouts)", n)
	}
}
