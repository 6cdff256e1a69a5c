package render

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// scalar is implemented by the value types of the spec grammar (sizes, CPU
// amounts, durations, addresses, prefixes). parseScalar receives the scalar's
// text, whatever YAML type it resolved to, and returns a message fit to follow
// the field path when the text is not valid.
type scalar interface {
	parseScalar(text string) error
}

// maxDepth bounds nesting, including through aliases, so that a hostile
// document (an alias that refers to its own ancestor) cannot recurse forever.
const maxDepth = 32

// decoder turns a yaml.Node tree into Go values strictly: unknown fields,
// duplicate keys and wrong types are errors with their position, and the
// position of every value decoded is recorded by field path so that later
// checks can point at it.
type decoder struct {
	file  string
	diag  *diagnoser
	pos   map[string]Position
	empty map[string]bool // paths written with an empty value
	depth int
}

func (d *decoder) position(n *yaml.Node) Position {
	return Position{File: d.file, Line: n.Line, Column: n.Column}
}

// at returns the position recorded for path, or for its nearest recorded
// parent when the field itself was not written.
func (d *decoder) at(path string) Position {
	for {
		if p, ok := d.pos[path]; ok {
			return p
		}
		i := strings.LastIndexAny(path, ".[")
		if i < 0 {
			if p, ok := d.pos[""]; ok {
				return p
			}
			return Position{File: d.file}
		}
		path = path[:i]
	}
}

func (d *decoder) errorf(n *yaml.Node, path, format string, args ...any) {
	d.diag.decodeErrorf(d.position(n), path, format, args...)
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// decode fills v (addressable) from n.
func (d *decoder) decode(n *yaml.Node, v reflect.Value, path string) {
	d.depth++
	defer func() { d.depth-- }()
	if d.depth > maxDepth {
		d.errorf(n, path, "nested too deeply")
		return
	}
	if n.Kind == yaml.AliasNode {
		if n.Alias == nil {
			d.errorf(n, path, "unknown alias")
			return
		}
		d.decode(n.Alias, v, path)
		return
	}
	d.pos[path] = d.position(n)
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		if d.empty == nil {
			d.empty = map[string]bool{}
		}
		d.empty[path] = true
		return // an empty value leaves the zero value, and defaults apply
	}
	if s, ok := v.Addr().Interface().(scalar); ok {
		if n.Kind != yaml.ScalarNode {
			d.errorf(n, path, "expected a single value, got %s", describe(n))
			return
		}
		if err := s.parseScalar(n.Value); err != nil {
			d.errorf(n, path, "%s", err.Error())
		}
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		elem := reflect.New(v.Type().Elem())
		d.decode(n, elem.Elem(), path)
		v.Set(elem)
	case reflect.Struct:
		d.decodeStruct(n, v, path)
	case reflect.Map:
		d.decodeMap(n, v, path)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			d.errorf(n, path, "expected a list, got %s", describe(n))
			return
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, item := range n.Content {
			d.decode(item, s.Index(i), fmt.Sprintf("%s[%d]", path, i))
		}
		v.Set(s)
	case reflect.String:
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
			if n.Kind == yaml.ScalarNode {
				d.errorf(n, path, "expected a string, got %s (quote it: %q)", describe(n), n.Value)
			} else {
				d.errorf(n, path, "expected a string, got %s", describe(n))
			}
			return
		}
		v.SetString(n.Value)
	case reflect.Int:
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
			d.errorf(n, path, "expected an integer, got %s", describe(n))
			return
		}
		i, err := strconv.ParseInt(n.Value, 0, 64)
		if err != nil || i != int64(int(i)) {
			d.errorf(n, path, "%q is out of range", n.Value)
			return
		}
		v.SetInt(i)
	case reflect.Bool:
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" {
			d.errorf(n, path, "expected true or false, got %s", describe(n))
			return
		}
		v.SetBool(n.Value == "true" || n.Value == "True" || n.Value == "TRUE")
	default:
		panic(fmt.Sprintf("render: cannot decode into %s", v.Type()))
	}
}

// mappingPairs checks that n is a mapping without merge or duplicate keys,
// and returns its key and value nodes. Non-string keys are errors.
func (d *decoder) mappingPairs(n *yaml.Node, path string) (keys, values []*yaml.Node) {
	if n.Kind != yaml.MappingNode {
		d.errorf(n, path, "expected a mapping (key: value), got %s", describe(n))
		return nil, nil
	}
	seen := make(map[string]*yaml.Node, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.ShortTag() == "!!merge" {
			d.errorf(k, path, "YAML merge keys (<<) are not supported: write the fields out")
			continue
		}
		if k.Kind != yaml.ScalarNode || k.ShortTag() == "!!null" {
			d.errorf(k, path, "expected a key, got %s", describe(k))
			continue
		}
		if first, dup := seen[k.Value]; dup {
			d.errorf(k, join(path, k.Value), "duplicate key (first at line %d)", first.Line)
			continue
		}
		seen[k.Value] = k
		keys = append(keys, k)
		values = append(values, val)
	}
	return keys, values
}

func (d *decoder) decodeStruct(n *yaml.Node, v reflect.Value, path string) {
	keys, values := d.mappingPairs(n, path)
	fields := yamlFields(v.Type())
	for i, k := range keys {
		idx, ok := fields[k.Value]
		if !ok {
			names := make([]string, 0, len(fields))
			for name := range fields {
				names = append(names, name)
			}
			msg := fmt.Sprintf("unknown field %q", k.Value)
			if s := suggest(k.Value, names); s != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", s)
			}
			d.errorf(k, join(path, k.Value), "%s", msg)
			continue
		}
		d.decode(values[i], v.Field(idx), join(path, k.Value))
	}
}

func (d *decoder) decodeMap(n *yaml.Node, v reflect.Value, path string) {
	keys, values := d.mappingPairs(n, path)
	m := reflect.MakeMapWithSize(v.Type(), len(keys))
	for i, k := range keys {
		if k.ShortTag() != "!!str" && v.Type().Key().Kind() == reflect.String {
			// Keys like 8080 or true are legal YAML but surprising map keys.
			d.errorf(k, join(path, k.Value), "expected a string key, got %s (quote it: %q)", describe(k), k.Value)
			continue
		}
		elem := reflect.New(v.Type().Elem()).Elem()
		p := join(path, k.Value)
		d.pos[p+"#key"] = d.position(k)
		before := len(d.diag.diags)
		d.decode(values[i], elem, p)
		if len(d.diag.diags) > before {
			continue // reported; an entry with a broken value is left out
		}
		m.SetMapIndex(reflect.ValueOf(k.Value).Convert(v.Type().Key()), elem)
	}
	v.Set(m)
}

// yamlFields maps each yaml tag name of struct type t to its field index.
func yamlFields(t reflect.Type) map[string]int {
	fields := make(map[string]int, t.NumField())
	for i := range t.NumField() {
		tag, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if tag != "" && tag != "-" {
			fields[tag] = i
		}
	}
	return fields
}

// describe names the YAML type of n for messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.DocumentNode:
		return "a document"
	}
	switch n.ShortTag() {
	case "!!str":
		return fmt.Sprintf("the string %q", n.Value)
	case "!!int":
		return "an integer"
	case "!!float":
		return "a number"
	case "!!bool":
		return "a boolean"
	case "!!null":
		return "nothing"
	case "!!timestamp":
		return "a timestamp"
	}
	return "a value of type " + n.ShortTag()
}

// suggest returns the candidate closest to s when it is close enough to be a
// likely typo (same letters in another case, or at most two edits away).
func suggest(s string, candidates []string) string {
	best, bestDist := "", 3
	for _, c := range candidates {
		if strings.EqualFold(c, s) {
			return c
		}
		if d := editDistance(strings.ToLower(s), strings.ToLower(c)); d < bestDist || (d == bestDist && c < best) {
			best, bestDist = c, d
		}
	}
	return best
}

// editDistance is the optimal string alignment distance between a and b:
// insertions, deletions, substitutions and transpositions of neighbours
// each count one, so "wbe" is one edit from "web".
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}
