package render

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"regexp"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// IgnoreFile is the optional file at the repository root, in gitignore
// syntax, that lists paths which are not Keel specs.
const IgnoreFile = ".keelignore"

// LockFile is the file at the repository root that holds allocations.
const LockFile = "keel.lock"

// ClusterFile is where the Cluster document lives.
const ClusterFile = "cluster.yaml"

// NodesDir is the directory of the node inventory, one file per node.
const NodesDir = "nodes"

// SpecFiles lists the files of fsys that hold Keel specs, sorted: every
// *.yaml and *.yml file that is not a dotfile, not under a dot-directory and
// not matched by .keelignore. It reads them as ReadFiles does, and fails
// where ReadFiles does.
func SpecFiles(fsys fs.FS) ([]string, error) {
	files, err := ReadFiles(fsys)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, f := range files {
		if f.Path != IgnoreFile && f.Path != LockFile {
			out = append(out, f.Path)
		}
	}
	return out, nil
}

// rawDoc is one YAML document of a spec file, its kind known.
type rawDoc struct {
	file string
	kind string
	node *yaml.Node // the document's top-level mapping
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// splitDocuments parses a file into its documents and reads each one's
// apiVersion and kind. Documents that are not Keel's are reported with a hint
// to list the file in .keelignore.
func splitDocuments(file string, data []byte, diag *diagnoser) []rawDoc {
	var docs []rawDoc
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			pos, msg := Position{File: file, Line: 1, Column: 1}, err.Error()
			if m := yamlLine.FindStringSubmatch(msg); m != nil {
				pos.Line, _ = strconv.Atoi(m[1])
				msg = m[2]
			} else {
				msg = strings.TrimPrefix(msg, "yaml: ")
			}
			diag.errorf(pos, "", "invalid YAML: %s", msg)
			return docs
		}
		if len(doc.Content) == 0 {
			continue
		}
		root := doc.Content[0]
		if root.Kind == yaml.ScalarNode && root.ShortTag() == "!!null" {
			continue // an empty document, e.g. after a trailing ---
		}
		if d, ok := readHeader(file, root, diag); ok {
			docs = append(docs, d)
		}
	}
}

var kinds = []string{KindCluster, KindNode, KindJail, KindService, KindIngress}

func readHeader(file string, root *yaml.Node, diag *diagnoser) (rawDoc, bool) {
	pos := Position{File: file, Line: root.Line, Column: root.Column}
	notKeel := fmt.Sprintf("if %s is not a Keel spec, list it in %s to skip it", file, IgnoreFile)
	if root.Kind != yaml.MappingNode {
		diag.errorf(pos, "", "expected a Keel document (a mapping with apiVersion, kind, metadata and spec), got %s; %s", describe(root), notKeel)
		return rawDoc{}, false
	}
	var h header
	var apiNode, kindNode *yaml.Node
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		switch k.Value {
		case "apiVersion":
			apiNode, h.APIVersion = v, v.Value
		case "kind":
			kindNode, h.Kind = v, v.Value
		}
	}
	switch {
	case apiNode == nil:
		diag.errorf(pos, "apiVersion", "missing: this is not a Keel document (want apiVersion: %s); %s", APIVersion, notKeel)
		return rawDoc{}, false
	case apiNode.Kind != yaml.ScalarNode || !strings.HasPrefix(h.APIVersion, "keel/"):
		diag.errorf(Position{File: file, Line: apiNode.Line, Column: apiNode.Column}, "apiVersion",
			"%q is not a Keel apiVersion (want %s); %s", h.APIVersion, APIVersion, notKeel)
		return rawDoc{}, false
	case h.APIVersion != APIVersion:
		diag.errorf(Position{File: file, Line: apiNode.Line, Column: apiNode.Column}, "apiVersion",
			"%q is not supported by this version of keel (it reads %s)", h.APIVersion, APIVersion)
		return rawDoc{}, false
	case kindNode == nil:
		diag.errorf(pos, "kind", "missing (want one of %s)", strings.Join(kinds, ", "))
		return rawDoc{}, false
	}
	for _, k := range kinds {
		if h.Kind == k {
			return rawDoc{file: file, kind: k, node: root}, true
		}
	}
	msg := fmt.Sprintf("%q is not a kind of keel/v1 (want one of %s)", h.Kind, strings.Join(kinds, ", "))
	if s := suggest(h.Kind, kinds); s != "" {
		msg = fmt.Sprintf("%q is not a kind of keel/v1 (did you mean %q?)", h.Kind, s)
	}
	diag.errorf(Position{File: file, Line: kindNode.Line, Column: kindNode.Column}, "kind", "%s", msg)
	return rawDoc{}, false
}
