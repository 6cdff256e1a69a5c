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
