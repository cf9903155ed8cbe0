package file

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// jsonTree parses data as one JSON value into the tree yaml.v3 builds for
// YAML, lines included, so that both formats share one schema check.
// yaml.v3 alone is no JSON parser: it rejects the escapes \/ and surrogate
// pairs (\ud83d\ude00) that JSON encoders write, and a key whose colon is on
// the next line.
func jsonTree(file string, data []byte) (*yaml.Node, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, &fileError{File: file, Line: 1, Msg: emptyFile}
	}
	// Unmarshal checks the whole input, trailing data included, and its
	// SyntaxError has the offset into data (the Decoder's is relative to
	// the token it was reading).
	var raw json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		line := 1
		if se, ok := errors.AsType[*json.SyntaxError](err); ok {
			line = lineAt(data, int(se.Offset)-1)
		}
		return nil, &fileError{File: file, Line: line, Msg: "JSON: " + strings.TrimPrefix(err.Error(), "json: ")}
	}
	j := &jsonParser{file: file, data: data, dec: json.NewDecoder(bytes.NewReader(data)), line: 1}
	j.dec.UseNumber()
	return j.value(0)
}

// maxJSONDepth bounds nesting (a services file needs four levels), so that
// the recursion of jsonParser.value stays small.
const maxJSONDepth = 32

type jsonParser struct {
	file string
	data []byte
	dec  *json.Decoder
	// line is the line at offset off; tokens come in order, so lines are
	// counted once.
	off, line int
}

// next returns the next token and its line. The input is valid JSON.
func (j *jsonParser) next() (json.Token, int, error) {
	// Token skips white space and the ',' and ':' it does not return.
	i := int(j.dec.InputOffset())
	for i < len(j.data) && strings.IndexByte(" \t\r\n,:", j.data[i]) >= 0 {
		i++
	}
	j.line += bytes.Count(j.data[j.off:i], []byte("\n"))
	j.off = i
	tok, err := j.dec.Token()
	return tok, j.line, err
}

func (j *jsonParser) value(depth int) (*yaml.Node, error) {
	tok, line, err := j.next()
	if err != nil {
		return nil, &fileError{File: j.file, Line: line, Msg: "JSON: " + err.Error()}
	}
	if depth > maxJSONDepth {
		return nil, &fileError{File: j.file, Line: line, Msg: "JSON nested more than " + strconv.Itoa(maxJSONDepth) + " levels deep"}
	}
	n := &yaml.Node{Kind: yaml.ScalarNode, Line: line}
	switch t := tok.(type) {
	case json.Delim:
		n.Kind, n.Tag = yaml.SequenceNode, "!!seq"
		if t == '{' {
			n.Kind, n.Tag = yaml.MappingNode, "!!map"
		}
		for j.dec.More() {
			if n.Kind == yaml.MappingNode {
				k, kline, err := j.next()
				if err != nil {
					return nil, &fileError{File: j.file, Line: kline, Msg: "JSON: " + err.Error()}
				}
				key, _ := k.(string)
				n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key, Line: kline})
			}
			v, err := j.value(depth + 1)
			if err != nil {
				return nil, err
			}
			n.Content = append(n.Content, v)
		}
		if _, line, err := j.next(); err != nil { // the closing delimiter
			return nil, &fileError{File: j.file, Line: line, Msg: "JSON: " + err.Error()}
		}
	case string:
		n.Tag, n.Value = "!!str", t
	case json.Number:
		n.Tag, n.Value = "!!float", t.String()
		if !strings.ContainsAny(n.Value, ".eE") {
			n.Tag = "!!int"
		}
	case bool:
		n.Tag, n.Value = "!!bool", strconv.FormatBool(t)
	case nil:
		n.Tag, n.Value = "!!null", "null"
	}
	return n, nil
}
