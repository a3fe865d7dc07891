;;;; An import job shaped like seed 004: each round receives a large octet buffer,
;;;; parses it into many small strings and conses, and drops it; only the last few
;;;; buffers stay referenced while a share of the parsed entries accumulates.
;;;; Then it measures its own heap as (room) does, prints the figures and READY, and
;;;; waits on stdin so that the heap can be read from outside at that moment. A line
;;;; "full-gc" runs (gc :full t) and reports again; end of input ends the program.
;;;; Usage: sbcl --script import_buffers.lisp ROUNDS [FRESH-STRINGS]

(defvar *rounds* (parse-integer (or (second sb-ext:*posix-argv*) "300")))
(defvar *fresh-strings* (parse-integer (or (third sb-ext:*posix-argv*) "40000")))
(defvar *recent* (make-array 8 :initial-element nil))
(defvar *kept* '())
(defvar *state* (sb-ext:seed-random-state 4))

(defun parse-buffer (buf round)
  (let ((entries '()))
    (dotimes (i 1500 entries)
      (let ((name (make-string (+ 8 (mod (aref buf (mod (* i 7) (length buf))) 24))
                               :initial-element #\n)))
        (setf (char name 0) (code-char (+ 65 (mod round 26))))
        (push (list name (princ-to-string i) (coerce "value" 'simple-base-string))
              entries)))))

(dotimes (round *rounds*)
  (let ((buf (make-array (+ 100000 (random 500000 *state*))
                         :element-type '(unsigned-byte 8))))
    (fill buf (mod round 251))
    (setf (aref *recent* (mod round (length *recent*))) buf)
    (let ((entries (parse-buffer buf round)))
      (when (zerop (mod round 5))
        (push (subseq entries 0 300) *kept*)))))

;; Fresh data in the youngest generation, so that it holds bytes too.
(gc)
(defvar *fresh* (loop repeat *fresh-strings* collect (make-string 40 :initial-element #\f)))

;; The report is written into a string made beforehand by code that allocates nothing,
;; so that the heap read from outside is the one measured, not one grown by printing.
(defvar *out* (make-string 65536))
(defvar *version* (lisp-implementation-version))
(defvar *newline* (string #\Newline))
(defvar *fill* 0)
(declaim (type fixnum *fill*) (type (simple-array character (*)) *out*))

(defun put-string (s)
  (loop for c across s do (setf (char *out* *fill*) c) (incf *fill*)))

(defun put-int (n)
  (declare (type (integer 0 #.most-positive-fixnum) n))
  (multiple-value-bind (q r) (floor n 10)
    (when (plusp q) (put-int q))
    (setf (char *out* *fill*) (code-char (+ 48 r)))
    (incf *fill*)))

(defun put-line (name &rest numbers)
  (declare (dynamic-extent numbers))
  (put-string name)
  (dolist (n numbers) (put-string " ") (put-int n))
  (put-string *newline*))
(defvar *bytes* (make-array 256 :element-type 'fixnum))
(defvar *counts* (make-array 256 :element-type 'fixnum))
(defvar *generations* (make-array 7 :element-type 'fixnum))
(defvar *gcs* (make-array 7 :element-type 'fixnum))

(defun report-heap ()
  (fill *bytes* 0)
  (fill *counts* 0)
  (setf *fill* 0)
  ;; What (room) counts: every object of the dynamic space by type code (conses
  ;; under list-pointer-lowtag).
  (let ((bytes *bytes*) (counts *counts*))
    (sb-vm:map-allocated-objects
     (lambda (obj type size)
       (declare (ignore obj) (fixnum type size))
       (incf (aref bytes type) size)
       (incf (aref counts type)))
     :dynamic))
  (let ((usage (sb-kernel:dynamic-usage))
        (referenced (loop for b across *recent*
                          sum (* 8 (+ 2 (* 2 (ceiling (length b) 16)))))))
    (dotimes (g 7)
      (setf (aref *generations* g) (sb-ext:generation-bytes-allocated g)
            (aref *gcs* g) (sb-ext:generation-number-of-gcs g)))
    (put-line "dynamic-usage" usage)
    (put-line "dynamic-space-size" (sb-ext:dynamic-space-size))
    (put-line "dynamic-space-start" sb-vm:dynamic-space-start)
    (put-line "page-bytes" sb-vm:gencgc-page-bytes)
    (put-string "version ") (put-string *version*) (put-string *newline*)
    (put-line "referenced-octet-bytes" referenced)
    (dotimes (g 7)
      (put-line "generation" g (aref *generations* g) (aref *gcs* g)))
    (dotimes (type 256)
      (when (plusp (aref *counts* type))
        (put-line "type" type (aref *counts* type) (aref *bytes* type))))
    (put-line "octet-vector-widetag" sb-vm:simple-array-unsigned-byte-8-widetag)
    (put-string "READY") (put-string *newline*)
    (write-string *out* *standard-output* :end *fill*)
    (finish-output)))

;; One function called from the top level: a top-level LOOP would be compiled (and
;; allocate) after the report.
(defun serve ()
  (report-heap)
  (loop for line = (read-line *standard-input* nil)
        while line
        do (cond ((string= line "full-gc")
                  (gc :full t)
                  (report-heap))
                 ((string= line "drop-caches")
                  ;; What (gc :full t) does before it collects (unsafe-clear-roots in
                  ;; src/code/gc.lisp), without collecting: 2.5 and 2.6 also drop
                  ;; buffer pools and the debugger's function maps, named here
                  ;; only where the release has them.
                  (sb-impl::drop-all-hash-caches)
                  (sb-impl::scrub-power-cache)
                  (dolist (name '(("SB-UNICODE" "*NAME->CHAR-BUFFERS*")
                                  ("SB-C" "*PHASH-LAMBDA-CACHE*")
                                  ("SB-IMPL" "*AVAILABLE-UB8-BUFFERS*")
                                  ("SB-IMPL" "*AVAILABLE-CHAR-BUFFERS*")
                                  ("SB-IMPL" "*READ-LINE-BUFFERS*")
                                  ("SB-DI" "*UNCOMPACTED-FUN-MAPS*")
                                  ("SB-DI" "*COMPILED-DEBUG-FUNS*")))
                    (let ((s (find-symbol (second name) (first name))))
                      (when (and s (boundp s))
                        (setf (symbol-value s) nil))))
                  (report-heap)))))

(serve)
