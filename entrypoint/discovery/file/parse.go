package file

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/seamless-lb/seamless/entrypoint/model"
)

// fileError is a problem in one services file. Line is 1-based, 0 when the
// problem has no line (the file could not be read).
type fileError struct {
	File string
	Line int
	Msg  string
}

func (e *fileError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
	}
	return e.File + ": " + e.Msg
}

// service is what one file declares.
type service struct {
	name      string
	line      int // of the name
	instances []model.Instance
}

const emptyFile = "the file is empty; it must declare one service (delete the file to remove a service)"

// parse reads one services file: JSON when its name ends in .json, else
// YAML. file names the file in errors; every error is a *fileError.
func parse(file string, data []byte) (*service, error) {
	data = bytes.TrimPrefix(data, []byte("\ufeff"))
	if !utf8.Valid(data) {
		return nil, &fileError{File: file, Line: invalidUTF8Line(data), Msg: "not valid UTF-8 (services files are UTF-8)"}
	}
	var (
		root *yaml.Node
		err  error
	)
	if strings.EqualFold(filepath.Ext(file), ".json") {
		root, err = jsonTree(file, data)
	} else {
		root, err = yamlTree(file, data)
	}
	if err != nil {
		return nil, err
	}
	return (&schema{file: file}).service(root)
}

// yamlTree parses the one YAML document in data.
func yamlTree(file string, data []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &fileError{File: file, Line: 1, Msg: emptyFile}
		}
		return nil, yamlSyntaxError(file, data, err)
	}
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case err == nil:
		return nil, &fileError{File: file, Line: next.Line, Msg: "a second YAML document; a file declares one service"}
	case !errors.Is(err, io.EOF):
		return nil, yamlSyntaxError(file, data, err)
	}
	if len(doc.Content) == 0 || doc.Content[0].Tag == "!!null" {
		return nil, &fileError{File: file, Line: max(doc.Line, 1), Msg: emptyFile}
	}
	return doc.Content[0], nil
}

var yamlLine = regexp.MustCompile(`^yaml: (line (\d+): )?`)

// yamlSyntaxError turns an error of yaml.v3's parser into a fileError on the
// line of the problem. yaml.v3 names the line where the enclosing block
// starts (an instance's "- " for a field mis-indented three lines further
// down), or no line for a problem on the first line. The problem's own line
// is the first at which a prefix of the file fails with the same message,
// searched from yaml.v3's line on within a budget of bytes parsed; past the
// budget yaml.v3's line stands.
func yamlSyntaxError(file string, data []byte, err error) error {
	line, msg := splitYAMLError(err)
	budget := searchBudget
	lines := bytes.SplitAfter(data, []byte("\n"))
	n := 0 // bytes in lines[:i+1]
	for i, l := range lines {
		n += len(l)
		if i+1 < line {
			continue
		}
		if budget -= n; budget < 0 {
			break
		}
		if _, m := splitYAMLError(yamlFails(data[:n])); m == msg {
			line = i + 1
			break
		}
	}
	return &fileError{File: file, Line: max(line, 1), Msg: "YAML: " + msg}
}

// searchBudget bounds the bytes yamlSyntaxError parses; a file's result is
// cached by content, so this is spent once per malformed version.
const searchBudget = 4 << 20

// yamlFails returns the error parsing data as YAML documents gives, or nil.
func yamlFails(data []byte) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var doc yaml.Node
		if err := dec.Decode(&doc); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// splitYAMLError returns the line yaml.v3 names in err (1 when it names
// none: its problem is on the first line) and its message. It returns 0 for
// a nil err.
func splitYAMLError(err error) (int, string) {
	if err == nil {
		return 0, ""
	}
	msg := err.Error()
	line := 1
	if m := yamlLine.FindStringSubmatch(msg); m != nil && m[2] != "" {
		line, _ = strconv.Atoi(m[2])
	}
	return line, yamlLine.ReplaceAllString(msg, "")
}

// lineAt returns the 1-based line of byte offset off in data.
func lineAt(data []byte, off int) int {
	off = min(max(off, 0), len(data))
	return bytes.Count(data[:off], []byte("\n")) + 1
}

func invalidUTF8Line(data []byte) int {
	for i := 0; i < len(data); {
		r, size := utf8.DecodeRune(data[i:])
		if r == utf8.RuneError && size == 1 {
			return lineAt(data, i)
		}
		i += size
	}
	return 1
}
