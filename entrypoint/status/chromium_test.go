package status

import (
	"errors"
	"flag"
	"image"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/seamless-lb/seamless/internal/testenv"
)

var docsScreenshot = flag.String("screenshot", "", "also copy the page's screenshot to this file (the README's docs/status.png)")

// artifacts is where the screenshots are kept: $SEAMLESS_ARTIFACTS, else
// the test's temporary directory.
func artifacts(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("SEAMLESS_ARTIFACTS")
	if dir == "" {
		return t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestPageInChromium(t *testing.T) {
	bin := testenv.Chromium(t)
	url := serve(t, fixture(), nil, errors.New("source docker has not answered yet"))
	shot := filepath.Join(artifacts(t), "status.png")
	// Tall enough for every section of the fixture, as docs/status.png.
	testenv.RunChromium(t, bin, url+"/", "--screenshot="+shot, "--window-size=1280,2200")
	t.Logf("screenshot: %s", shot)

	f, err := os.Open(shot)
	if err != nil {
		t.Fatalf("no screenshot: %v", err)
	}
	img, err := png.Decode(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != 1280 || b.Dy() != 2200 {
		t.Errorf("screenshot is %v, want 1280×2200", b.Size())
	}
	// The style sheet was applied: the fills of the badges and pills
	// (healthy, not ready, a source down) are on screen.
	for name, c := range map[string]color.RGBA{
		"ok (#dafbe1)":   {0xda, 0xfb, 0xe1, 0xff},
		"warn (#fff8c5)": {0xff, 0xf8, 0xc5, 0xff},
		"bad (#ffebe9)":  {0xff, 0xeb, 0xe9, 0xff},
	} {
		if !hasColor(img, c) {
			t.Errorf("the screenshot has no %s: the page did not render as styled", name)
		}
	}
	if *docsScreenshot != "" {
		b, err := os.ReadFile(shot)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(*docsScreenshot, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func hasColor(img image.Image, want color.RGBA) bool {
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			if color.RGBAModel.Convert(img.At(x, y)) == want {
				return true
			}
		}
	}
	return false
}

var (
	tagRe  = regexp.MustCompile(`<([a-zA-Z][a-zA-Z0-9-]*)((?:\s+[^\s"'>/=]+(?:="[^"]*")?)*)\s*/?>`)
	attrRe = regexp.MustCompile(`\s+([^\s"'>/=]+)(?:="[^"]*")?`)
)

// A browser parses what the escaping produced: the hostile values end up
// as text, no element and no script comes of them.
func TestHostilePageInChromium(t *testing.T) {
	bin := testenv.Chromium(t)
	url := serve(t, hostile(), errors.New(`<script>document.title="pwned"</script>`), nil)
	shot := filepath.Join(artifacts(t), "status-hostile.png")
	testenv.RunChromium(t, bin, url+"/", "--screenshot="+shot, "--window-size=1280,900")
	t.Logf("screenshot: %s", shot)
	dom := testenv.RunChromium(t, bin, url+"/", "--dump-dom")
	if !strings.Contains(dom, "</html>") {
		t.Fatalf("chromium dumped no document:\n%s", dom)
	}
	// In serialised HTML a text's "<" is "&lt;" and an attribute's '"' is
	// "&quot;", so these patterns see every element and attribute.
	allowed := map[string]bool{}
	for _, e := range strings.Fields("html head meta title style body header main section h1 h2 small div span a table thead tbody tr th td code p ul li") {
		allowed[e] = true
	}
	tags := tagRe.FindAllStringSubmatch(dom, -1)
	if len(tags) < 100 {
		t.Fatalf("only %d tags recognised in the DOM:\n%s", len(tags), dom)
	}
	for _, m := range tags {
		if !allowed[strings.ToLower(m[1])] {
			t.Errorf("the DOM Chromium built has a <%s> element: %s", m[1], m[0])
		}
		for _, a := range attrRe.FindAllStringSubmatch(m[2], -1) {
			if name := strings.ToLower(a[1]); strings.HasPrefix(name, "on") || name == "src" {
				t.Errorf("the DOM Chromium built has an attribute %s: %s", name, m[0])
			}
		}
	}
	if strings.Contains(dom, "pwned</title>") {
		t.Error("the title was changed by a script")
	}
	if !strings.Contains(dom, `&lt;script&gt;document.title="pwned"&lt;/script&gt;`) {
		t.Error("the hostile text is not in the DOM as text")
	}
}
