;;;; An import job shaped like seed 004: each round receives a large octet buffer,
;;;; parses it into many small strings and conses and drops it, while a share of the
;;;; parsed entries accumulates. Then it prints its own view of the heap (dynamic usage
;;;; and bytes per generation, as sb-ext counts them) on stderr and idles, allocating
;;;; nothing, so that censuses taken meanwhile can be checked against those figures.
;;;; Usage: sbcl --script import_job.lisp ROUNDS IDLE-SECONDS

(defvar *rounds* (parse-integer (or (second sb-ext:*posix-argv*) "300")))
(defvar *idle* (parse-integer (or (third sb-ext:*posix-argv*) "2")))
(defvar *kept* '())
(defvar *state* (sb-ext:seed-random-state 4))

(defun parse-buffer (buf round)
  (let ((entries '()))
    (dotimes (i 1500 entries)
      (let ((name (make-string (+ 8 (mod (aref buf (mod (* i 7) (length buf))) 24))
                               :initial-element #\n)))
        (setf (char name 0) (code-char (+ 65 (mod round 26))))
        (push (list name (princ-to-string i)) entries)))))

(dotimes (round *rounds*)
  (let* ((buf (make-array (+ 100000 (random 500000 *state*))
                          :element-type '(unsigned-byte 8)))
         (entries (progn (fill buf (mod round 251)) (parse-buffer buf round))))
    (when (zerop (mod round 5))
      (push (first entries) *kept*))))

(format *error-output* "dynamic-usage ~D~%" (sb-kernel:dynamic-usage))
(dotimes (g 7)
  (format *error-output* "generation ~D ~D~%" g (sb-ext:generation-bytes-allocated g)))
(format *error-output* "kept ~D~%" (length *kept*))
(finish-output *error-output*)
(sleep *idle*)
