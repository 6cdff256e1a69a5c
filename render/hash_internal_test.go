package render

import (
	"slices"
	"strings"
	"testing"
)

// Issue 11: a change's detail shows old → new for every field, with the
// values of secret-looking environment variables masked and long values
// cut.
func TestCompareSpecsDetails(t *testing.T) {
	from := JailSpec{Image: "base/a", Command: []string{"/bin/web", "-v"}, Env: map[string]string{"GREETING": "hi", "API_TOKEN": "s3cr3t-old", "GONE": "x"},
		Resources: Resources{CPU: 100, Memory: 64 << 20}, RestartPolicy: "always"}
	to := JailSpec{Image: "base/b", Command: []string{"/bin/web"}, Env: map[string]string{"GREETING": strings.Repeat("é", 80), "API_TOKEN": "s3cr3t-new", "DB_PASSWORD": "hunter2"},
		Resources: Resources{CPU: 250, Memory: 64 << 20}, RestartPolicy: "on-failure"}
	var got []string
	for _, f := range CompareSpecs(from, to) {
		got = append(got, f.Detail)
	}
	want := []string{
		"image: base/a → base/b",
		"command: /bin/web -v → /bin/web",
		`env: API_TOKEN: (masked) → (masked), +DB_PASSWORD=(masked), -GONE, GREETING: "hi" → "` + strings.Repeat("é", 30) + `…"`,
		"resources: cpu 100m → 250m",
		"restartPolicy: always → on-failure",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("details:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, d := range got {
		if strings.Contains(d, "s3cr3t") || strings.Contains(d, "hunter2") {
			t.Errorf("a secret is shown: %s", d)
		}
	}
}

// The artifacts change of docs/spec.md's "What a change does".
func TestArtifactsDiffDocExample(t *testing.T) {
	from := []Artifact{
		{URL: "https://a.example.org/old", SHA256: strings.Repeat("1", 64), Path: "/opt/old", Mode: 0o644},
		{URL: "https://a.example.org/conf", SHA256: "b79606fb3afea5bd1609ed40b622142f1c98125abcfe89a76a661b0e8e343910", Path: "/usr/local/etc/app.conf", Mode: 0o644},
	}
	to := []Artifact{
		{URL: "https://a.example.org/exporter", SHA256: "9f9b4855ff8b3f709d0ce99cff96824db4d05c9fd63bbf855632a90805e6e941", Path: "/usr/local/bin/exporter", Mode: 0o755},
		{URL: "https://a.example.org/conf", SHA256: "4b5e57f6eb2f42b9039b3d1e13929295f231749c510cbe341cd68036d9af97e2", Path: "/usr/local/etc/app.conf", Mode: 0o600},
	}
	want := "-/opt/old; +/usr/local/bin/exporter (sha256 9f9b4855…); /usr/local/etc/app.conf: sha256 b79606fb… → 4b5e57f6…, mode 0644 → 0600"
	if got := artifactsDiff(from, to); got != want {
		t.Errorf("artifactsDiff:\n%s\nwant:\n%s", got, want)
	}
	// Render sorts artifacts by path; a spec built otherwise may differ
	// only in their order.
	if got := artifactsDiff(to, []Artifact{to[1], to[0]}); got != "reordered" {
		t.Errorf("artifactsDiff of the same artifacts reordered = %q, want reordered", got)
	}
}
